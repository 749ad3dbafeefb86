"""The sweep in child processes: OOM, unsupported and timeouts are rows; append; resume."""

from __future__ import annotations

import json
from pathlib import Path

from lmperf.attention.report import render
from lmperf.attention.spec import AttnSpec
from lmperf.attention.sweep import SweepOptions, pending_specs, run_sweep

QUICK = dict(d=16, warmup=0, repeats=2, threads=1)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_too_large_seq_is_an_oom_row_and_the_rest_completes(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    out = tmp_path / "a.jsonl"
    specs = [AttnSpec("naive", seq=64, **QUICK),
             AttnSpec("naive", seq=16384, **QUICK),  # one 16384^2 fp32 matrix is 1 GiB: over the cap
             AttnSpec("flash-triton", seq=64, **QUICK),  # no GPU, no interpreter: no child started
             AttnSpec("flash-torch", seq=64, **QUICK)]
    records = run_sweep(specs, out, SweepOptions(max_memory_gib=1.5))
    assert [r["status"] for r in records] == ["ok", "oom", "unsupported", "ok"]
    assert "out of memory while timing the forward" in records[1]["message"]
    assert "capped at 1.5 GiB" in records[1]["memory_cap"]
    assert records[1]["metrics"]["analytic"]["score_matrix_mib"] == 1024
    assert all(r["kind"] == "attention" for r in records)
    assert _lines(out) == records
    text = render(records)
    assert "oom" in text and "unsupported" in text


def test_a_child_past_its_timeout_is_killed_and_is_an_error_row(tmp_path):
    (r,) = run_sweep([AttnSpec("naive", seq=64, **QUICK)], tmp_path / "a.jsonl",
                     SweepOptions(timeout_s=0.2))  # not even torch imports in 0.2 s
    assert r["status"] == "error" and r["kind"] == "attention"
    assert "timed out after 0.2 s" in r["message"]
    assert r["spec"]["impl"] == "naive" and r["env"]["torch"]


def test_resume_runs_only_what_is_not_ok_and_appends(tmp_path):
    out = tmp_path / "a.jsonl"
    out.write_text('{"earlier": "not ours"}\n')
    a, b = AttnSpec("naive", seq=32, **QUICK), AttnSpec("sdpa", seq=32, **QUICK)
    run_sweep([a], out, SweepOptions(isolate=False))
    # a non-ok row does not count as done; a foreign line is not a record and is refused
    out.write_text(out.read_text().split("\n", 1)[1])
    with open(out, "a") as f:
        f.write(json.dumps(dict(_lines(out)[0], spec=b.to_dict(), status="oom")) + "\n")
    assert pending_specs([a, b], out, resume=True) == [b]
    records = run_sweep([a, b], out, SweepOptions(isolate=False, resume=True))
    assert [r["spec"]["impl"] for r in records] == ["sdpa"]
    assert len(_lines(out)) == 3
