"""Schema-1 records are migrated on read, in one place (`results.record.migrate`): real files
written before issue 17's renames (by the lmperf of commit 6ef74eb: `context_length`,
`batch_size`, attention's `impl`/`seq`/`repeats`) load with today's names, render, compare, and
are recognised by `--resume`; a record written now says schema 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import lmperf
from lmperf.cli import main
from lmperf.results.record import migrate, spec_id
from lmperf.results.schema import SCHEMA_VERSION
from lmperf.results.store import read_records

RECORDS = Path(__file__).parent.parent / "fixtures" / "records"
OLD_NAMES = {"context_length", "batch_size", "model_context_length", "impl", "seq", "repeats"}


@pytest.mark.parametrize("name", ["bench", "attention", "memory"])
def test_older_records_are_read_with_todays_names(name):
    records = read_records(RECORDS / f"{name}-before-issue17.jsonl")
    assert records
    for r in records:
        assert not OLD_NAMES & set(r["spec"]), r["spec"]
        assert r["spec"]["context"] == 16 and r["schema"] == SCHEMA_VERSION == 3


SCHEMA_1 = [*sorted(RECORDS.glob("*-before-issue17.jsonl")),
            *sorted((RECORDS.parent.parent / "compare" / "data").glob("*.jsonl")),
            RECORDS.parent.parent / "profile" / "data" / "profile_records_v0.jsonl"]


def test_older_records_render(capsys):
    files = sorted(str(p) for p in RECORDS.glob("*-before-issue17.jsonl"))
    assert main(["table", *files, "--format", "csv"]) == 0
    assert "16" in capsys.readouterr().out


@pytest.mark.parametrize("path", SCHEMA_1, ids=lambda p: p.name)
def test_every_schema_1_fixture_loads_through_table_report_and_compare(path, tmp_path, capsys):
    assert {json.loads(line)["schema"] for line in path.open()} == {1}  # real schema-1 files
    assert main(["table", str(path), "--format", "csv"]) == 0
    assert main(["report", str(path), "-o", str(tmp_path / "r.html")]) == 0
    assert (tmp_path / "r.html").stat().st_size > 1000
    kind = json.loads(path.open().readline())["kind"]
    if kind in ("bench", "attention", "profile"):  # compare reads these kinds
        same = lmperf.compare(path, path)  # (profile's v0 records have no raw samples to compare)
        assert len(same.frame) > 0 if kind != "profile" else "not compared" in same.tables


def test_the_job_id_follows_the_renamed_spec_where_the_spec_is_the_jobs():
    (old,) = [json.loads(line) for line in (RECORDS / "bench-before-issue17.jsonl").open()]
    (new,) = migrate([old])
    assert old["job_id"] == spec_id("bench", old["spec"])
    assert new["job_id"] == spec_id("bench", new["spec"]) != old["job_id"]
    rounds = migrate([{**old, "job_id": old["job_id"] + "-r1"}])[0]["job_id"]
    assert rounds == new["job_id"] + "-r1"
    # a job of several records (memory's) cannot be rebuilt from one record: its id stays
    old_memory = [json.loads(line) for line in (RECORDS / "memory-before-issue17.jsonl").open()]
    assert [r["job_id"] for r in migrate(old_memory)] == [r["job_id"] for r in old_memory]
    assert old == json.loads((RECORDS / "bench-before-issue17.jsonl").read_text())  # untouched


def test_a_record_written_now_says_schema_3(tmp_path):
    out = tmp_path / "b.jsonl"
    lmperf.bench(size="tiny", context=16, batch=2, warmup=0, steps=1, precision="fp32",
                 mode="forward", out=out, inline=True)
    (line,) = out.read_text().splitlines()
    assert json.loads(line)["schema"] == 3


def _copy(name: str, tmp_path: Path) -> Path:
    out = tmp_path / f"{name}.jsonl"
    shutil.copy(RECORDS / f"{name}-before-issue17.jsonl", out)
    return out


@pytest.mark.parametrize("name, call", [
    ("bench", lambda out: lmperf.bench(size="tiny", context=16, batch=2, warmup=0, steps=2,
                                       precision="fp32", mode="forward", out=out, resume=True)),
    ("attention", lambda out: lmperf.attention("naive", context=16, d=8, warmup=0, steps=2,
                                               out=out, resume=True)),
])
def test_resume_recognises_jobs_written_before_the_renames(tmp_path, name, call):
    out = _copy(name, tmp_path)
    before = out.read_text()
    call(out)
    assert out.read_text() == before  # nothing ran again, nothing appended


def test_a_memory_job_written_before_the_renames_runs_again_on_resume(tmp_path):
    # Its records' specs are not its job's and its id was made from the old names: nothing
    # recognises it, so it is measured again (and the file, old rows and new, still loads).
    out = _copy("memory", tmp_path)
    lmperf.memory(size="tiny", context=16, batch=2, precision="fp32", mode="forward", warmup=0,
                  out=out, resume=True, inline=True)
    records = read_records(out)
    assert len(records) == 4 and {r["schema"] for r in records} == {3}


def test_records_loaded_by_other_means_are_migrated_too():
    from lmperf.core.kinds import build_reports

    raw = [json.loads(line) for line in (RECORDS / "bench-before-issue17.jsonl").read_text().splitlines()]
    (report,) = build_reports(raw)
    assert report.frame["context"].tolist() == [16]
    same = lmperf.compare(raw, raw)  # a list of dicts, as json.load gives them
    assert len(same.frame) > 0


def test_a_plan_candidate_of_schema_2_names_its_whole_layout():
    """Issue 40: 'fsdp+tp' is fsdp with its tp, 'tp' one replica of TP, ddp replicates."""
    base = {"schema": 2, "kind": "plan", "status": "ok", "message": "", "env": {},
            "metrics": {"rank": 1}, "warnings": []}
    request = {"size": "tiny", "gpus": 8, "search": "s", "precision": "bf16-mixed"}
    old = [{**base, "spec": {**request, "strategy": s, "tp": t}}
           for s, t in (("fsdp+tp", 2), ("tp", 8), ("ddp", 1), ("zero1", 1))]
    new = [r["spec"] for r in migrate(old)]
    assert [(s["strategy"], s["tp"], s["dp_replicate"], s["dp_shard"]) for s in new] == [
        ("fsdp", 2, 1, 4), ("single", 8, 1, 1), ("ddp", 1, 8, 1), ("zero1", 1, 1, 8)]
    assert all(s["pp"] == s["cp"] == 1 and s["pp_schedule"] is None for s in new)
    summary = migrate([{**base, "spec": {**request, "cell": "summary"}}])[0]
    assert summary["schema"] == 3 and "pp" not in summary["spec"]


def test_checkpoint_group_sizes_read_back_as_issue_41s_names_with_their_job_ids():
    """0 -> 'none', 1 -> 'full', G kept, in every kind's `checkpoint`, memory's
    `checkpoint_group` and a plan request's `checkpoints`; where the spec was its job's, the job
    id (and a round's) follows the named spec, a memory job's id stays."""
    base = {"schema": 2, "status": "ok", "message": "", "env": {}, "metrics": {},
            "warnings": []}
    bench = {"size": "tiny", "precision": "fp32", "checkpoint": 0}
    old = [{**base, "kind": "bench", "spec": {**bench, "checkpoint": g},
            "job_id": spec_id("bench", {**bench, "checkpoint": g}) + suffix}
           for g, suffix in ((0, ""), (1, "-r2"), (4, ""))]
    new = migrate(old)
    assert [r["spec"]["checkpoint"] for r in new] == ["none", "full", 4]
    assert [r["job_id"] for r in new] == [spec_id("bench", {**bench, "checkpoint": "none"}),
                                          spec_id("bench", {**bench, "checkpoint": "full"}) + "-r2",
                                          old[2]["job_id"]]
    memory = {**base, "kind": "memory", "job_id": "0123456789abcdef",
              "spec": {**bench, "analysis": "checkpoint", "checkpoint_group": 1}}
    (m,) = migrate([memory])
    assert (m["spec"]["checkpoint"], m["spec"]["checkpoint_group"], m["job_id"]) == (
        "none", "full", "0123456789abcdef")
    plan = {**base, "kind": "plan", "spec": {"search": "s", "checkpoints": [0, 1, 2],
                                             "checkpoint": 1}}
    (p,) = migrate([plan])
    assert (p["spec"]["checkpoints"], p["spec"]["checkpoint"]) == (["none", "full", 2], "full")


def test_resume_recognises_bench_jobs_written_with_group_sizes(tmp_path):
    """Real records of `lmperf bench --size tiny --context 64 --batch 2 --precision fp32
    bf16-mixed --checkpoint 0 1 --steps 3 --warmup 1` (2026-11-28, schema 2): the same command
    today (`--checkpoint none full` or its aliases) runs nothing again."""
    out = tmp_path / "b.jsonl"
    shutil.copy(Path(__file__).parents[1] / "bench" / "data" / "tiny_checkpoint_0_1.jsonl", out)
    before = out.read_text()
    lmperf.bench(size="tiny", context=64, batch=2, precision=["fp32", "bf16-mixed"],
                 checkpoint=["none", 1], steps=3, warmup=1, resume=True, out=out, inline=True)
    assert out.read_text() == before
