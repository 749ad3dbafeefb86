"""The sweep on the core: timeouts and unsupported combinations are rows; append; resume."""

from __future__ import annotations

import json
from pathlib import Path

from lmperf.questions.attention.report import build_report
from lmperf.questions.attention.spec import AttnSpec
from lmperf.questions.attention.api import run_sweep
from lmperf.core.sweep import SweepOptions, pending_specs

QUICK = dict(d=16, warmup=0, steps=2, threads=1)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_child_past_its_timeout_is_killed_and_is_an_error_row(tmp_path):
    (r,) = run_sweep([AttnSpec("naive", context=64, **QUICK)], tmp_path / "a.jsonl",
                     SweepOptions(timeout_s=0.2, warm=False))  # a cold child: not even torch imports in 0.2 s
    assert r["status"] == "error" and r["kind"] == "attention"
    assert "timed out after 0.2 s" in r["message"]
    assert r["spec"]["attention"] == "naive" and r["env"]["torch"]


def test_unsupported_is_a_row_made_without_a_child(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    (r,) = run_sweep([AttnSpec("flash-triton", context=64, **QUICK)], None, SweepOptions())
    assert r["status"] == "unsupported" and r["job_id"]
    assert r["metrics"]["analytic"]["score_matrix_mib"] == 64 * 64 * 4 / 2**20
    text = build_report([r]).render()
    assert "unsupported [1]" in text


def test_resume_runs_only_what_is_not_ok_and_appends(tmp_path):
    out = tmp_path / "a.jsonl"
    a, b = AttnSpec("naive", context=32, **QUICK), AttnSpec("sdpa", context=32, **QUICK)
    run_sweep([a], out, SweepOptions(isolate=False))
    # a non-ok row does not count as done
    with open(out, "a") as f:
        f.write(json.dumps(dict(_lines(out)[0], spec=b.to_dict(), status="oom", job_id="x")) + "\n")
    assert pending_specs([a, b], out, resume=True) == [b]
    records = run_sweep([a, b], out, SweepOptions(isolate=False, resume=True))
    # the whole sweep comes back (the ok row from before, the one run now); only b ran
    assert [r["spec"]["attention"] for r in records] == ["naive", "sdpa"]
    assert len(_lines(out)) == 3


def test_records_written_before_the_vocabulary_still_resume(tmp_path):
    # an older record: no job_id, no threads field; its spec still matches
    out = tmp_path / "a.jsonl"
    a = AttnSpec("naive", context=32, d=16, warmup=0, steps=2)
    (r,) = run_sweep([a], out, SweepOptions(isolate=False))
    old = {k: v for k, v in r.items() if k != "job_id"}
    old["spec"] = {k: v for k, v in r["spec"].items() if k != "threads"}
    out.write_text(json.dumps(old) + "\n")
    assert pending_specs([a], out, resume=True) == []
