"""Sweeps in child processes: OOM and crashes become rows, rows are appended, resume works."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmperf.workload.spec import RunSpec
from lmperf.core.sweep import SweepOptions, pending_specs, run_sweep
from lmperf.errors import ResultsFileError
from tests.conftest import CPU_CAP_GIB

QUICK = dict(context=16, batch=2, warmup=1, steps=2)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_oom_and_crash_are_rows_and_the_sweep_finishes(tmp_path):
    out = tmp_path / "r.jsonl"
    specs = [
        RunSpec.from_size("tiny", **QUICK),
        RunSpec.from_size("small", **QUICK),  # ~2 GiB of weights, grads and AdamW state: over the cap
        RunSpec.from_size("tiny", model="tests.fixtures.models:crashing", **QUICK),
        RunSpec.from_size("tiny", precision="bf16-mixed", **QUICK),
    ]
    # force: the real OOM and the crash, not the pre-flight's prediction (the bigram's 100M
    # parameters with AdamW state do not fit in 1.5 GiB either; it crashes before they are made)
    records = run_sweep(specs, out, SweepOptions(max_memory_gib=CPU_CAP_GIB, force=True))
    assert [r["status"] for r in records] == ["ok", "oom", "error", "ok"]
    assert "predicted" not in records[1]["message"]
    assert "out of memory" in records[1]["message"]
    assert f"process address space capped at {CPU_CAP_GIB:g} GiB" in records[1]["memory_cap"]
    assert "SIGABRT" in records[2]["message"]
    assert records[2]["spec"]["model"] == "tests.fixtures.models:crashing"
    assert records[2]["env"]["torch"]  # the parent filled in the environment
    assert _lines(out) == records  # every row on disk, in order


def test_a_child_past_its_timeout_is_killed_and_recorded(tmp_path):
    out = tmp_path / "r.jsonl"
    specs = [RunSpec.from_size("tiny", model="tests.fixtures.models:sleepy", **QUICK)]
    (record,) = run_sweep(specs, out, SweepOptions(timeout_s=8))
    assert record["status"] == "error"
    assert "timed out after 8 s" in record["message"]
    # the job said where it was before its first timed step (heartbeat while warming up)
    assert "0 of 2 steps had finished in warming up" in record["message"]


def test_results_are_appended_never_overwritten(tmp_path):
    out = tmp_path / "r.jsonl"
    # an earlier lmperf record (a file that is not lmperf JSONL is refused: tests/results)
    out.write_text('{"schema": 2, "kind": "bench", "status": "oom", "spec": {}}\n')
    before = out.read_bytes()
    run_sweep([RunSpec.from_size("tiny", **QUICK)], out, SweepOptions(isolate=False))
    assert out.read_bytes().startswith(before)
    assert len(out.read_text().splitlines()) == 2


def test_resume_runs_only_what_is_not_ok(tmp_path):
    out = tmp_path / "r.jsonl"
    a, b, c = (RunSpec.from_size("tiny", seed=s, **QUICK) for s in (1, 2, 3))
    run_sweep([a], out, SweepOptions(isolate=False))
    # b failed earlier: a non-ok row does not count as done
    bad = dict(_lines(out)[0], spec=b.to_dict(), status="oom", metrics=None)
    with open(out, "a") as f:
        f.write(json.dumps(bad) + "\n")
    assert pending_specs([a, b, c], out, resume=True) == [b, c]
    first = _lines(out)[0]
    records = run_sweep([a, b, c], out, SweepOptions(isolate=False, resume=True))
    # the whole sweep: a's row from the file (not run again), then the runs left
    assert [r["spec"]["seed"] for r in records] == [1, 2, 3]
    assert records[0] == first and len(_lines(out)) == 4
    assert pending_specs([a, b, c], out, resume=True) == []


def test_resume_refuses_a_corrupt_file_and_leaves_it_alone(tmp_path):
    out = tmp_path / "r.jsonl"
    run_sweep([RunSpec.from_size("tiny", **QUICK)], out, SweepOptions(isolate=False))
    with open(out, "a") as f:
        f.write('{"status": "ok", "spec": {"trunc\n')
    before = out.read_bytes()
    with pytest.raises(ResultsFileError, match="line 2 is not valid JSON"):
        run_sweep([RunSpec.from_size("tiny", seed=9, **QUICK)], out, SweepOptions(resume=True))
    assert out.read_bytes() == before


def test_resume_of_a_job_of_items_runs_only_the_items_without_an_ok_row(tmp_path):
    """A job that writes one record per item (lmperf dist's) is narrowed to its missing items."""
    from dataclasses import asdict, dataclass
    from typing import ClassVar

    from lmperf.results.schema import make_record
    from lmperf.results.store import append_record

    @dataclass(frozen=True)
    class Items:
        kind: ClassVar[str] = "dist"
        runner: ClassVar[str] = "unused:unused"
        names: tuple[str, ...] = ("a", "b", "c")
        device: str = "cpu"

        def to_dict(self) -> dict:
            return asdict(self)

        def items(self) -> list[str]:
            return list(self.names)

        def item_spec(self, item: str) -> dict:
            return {"item": item, "device": self.device}

        def with_items(self, items: list[str]) -> "Items":
            return Items(names=tuple(items))

    out = tmp_path / "r.jsonl"
    job = Items()
    append_record(out, make_record("dist", job.item_spec("a"), "ok", {}, metrics={}))
    append_record(out, make_record("dist", job.item_spec("b"), "error", {}, message="boom"))
    (left,) = pending_specs([job], out, resume=True)
    assert left.items() == ["b", "c"]  # a is done; b failed and runs again
    append_record(out, make_record("dist", job.item_spec("b"), "ok", {}, metrics={}))
    append_record(out, make_record("dist", job.item_spec("c"), "ok", {}, metrics={}))
    assert pending_specs([job], out, resume=True) == []
    assert pending_specs([job], out, resume=False) == [job]
