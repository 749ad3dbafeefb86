"""Records written before issue 17's renames (real files, written by the lmperf of commit
6ef74eb: `context_length`, `batch_size`, attention's `impl`/`seq`/`repeats`) load with today's
names, render, and are recognised by `--resume`."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import lmperf
from lmperf.cli import main
from lmperf.results.record import spec_before_renames
from lmperf.results.store import read_records

RECORDS = Path(__file__).parent.parent / "fixtures" / "records"
OLD_NAMES = {"context_length", "batch_size", "model_context_length", "impl", "seq", "repeats"}


@pytest.mark.parametrize("name", ["bench", "attention", "memory"])
def test_older_records_are_read_with_todays_names(name):
    records = read_records(RECORDS / f"{name}-before-issue17.jsonl")
    assert records
    for r in records:
        assert not OLD_NAMES & set(r["spec"]), r["spec"]
        assert r["spec"]["context"] == 16


def test_older_records_render(capsys):
    files = sorted(str(p) for p in RECORDS.glob("*-before-issue17.jsonl"))
    assert main(["table", *files, "--format", "csv"]) == 0
    assert "16" in capsys.readouterr().out


def test_spec_before_renames_inverts_the_migration():
    (old,) = [l for l in (RECORDS / "bench-before-issue17.jsonl").read_text().splitlines()]
    (new,) = read_records(RECORDS / "bench-before-issue17.jsonl")
    import json

    assert spec_before_renames("bench", new["spec"]) == json.loads(old)["spec"]
    assert spec_before_renames("train", {"context": 64}) is None  # train's fields kept their names


def _copy(name: str, tmp_path: Path) -> Path:
    out = tmp_path / f"{name}.jsonl"
    shutil.copy(RECORDS / f"{name}-before-issue17.jsonl", out)
    return out


@pytest.mark.parametrize("name, call", [
    ("bench", lambda out: lmperf.bench(size="tiny", context=16, batch=2, warmup=0, steps=2,
                                       precision="fp32", mode="forward", out=out, resume=True)),
    ("attention", lambda out: lmperf.attention("naive", context=16, d=8, warmup=0, steps=2,
                                               out=out, resume=True)),
    # a job of several records: only its job id (written before the rename) recognises it
    ("memory", lambda out: lmperf.memory(size="tiny", context=16, batch=2, precision="fp32",
                                         mode="forward", warmup=0, out=out, resume=True)),
])
def test_resume_recognises_jobs_written_before_the_renames(tmp_path, name, call):
    out = _copy(name, tmp_path)
    before = out.read_text()
    call(out)
    assert out.read_text() == before  # nothing ran again, nothing appended


def test_records_loaded_by_other_means_are_migrated_too():
    import json

    from lmperf.core.kinds import build_reports

    raw = [json.loads(line) for line in (RECORDS / "bench-before-issue17.jsonl").read_text().splitlines()]
    (report,) = build_reports(raw)
    assert report.frame["context"].tolist() == [16]
    same = lmperf.compare(raw, raw)  # a list of dicts, as json.load gives them
    assert len(same.frame) > 0
