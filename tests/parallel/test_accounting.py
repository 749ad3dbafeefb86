"""Communication accounting on CUDA, read from real Kineto traces (issue 19, finding 4).

On CUDA the host closes a step's range while the kernels it launched still run (NCCL ones
above all), so the accounting places each kernel in the step that launched it and counts it in
full, reads only the host's ranges (not Kineto's device copies) and says that collective time
includes waiting for peers. The traces are real: an 8-GPU A100 NCCL run
(tests/parallel/data/README.md) and a V100 DDP run (tests/profile/data/README.md).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from lmperf.questions.parallel import accounting, train

HERE = Path(__file__).resolve().parent
A100 = HERE / "data" / "a100_8gpu_rank3_control.json.gz"
V100 = HERE.parent / "profile" / "data" / "v100_ddp_sgd_5steps.json.gz"


@pytest.fixture(scope="module")
def a100() -> dict:
    with gzip.open(A100, "rt", encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def v100() -> dict:
    with gzip.open(V100, "rt", encoding="utf-8") as f:
        return json.load(f)


def _by_launch(doc: dict, name: str) -> list[tuple[list, list]]:
    """The oracle, written out plainly: per host range `name`, the (NCCL, other) kernels whose
    launch (same correlation id) starts inside it, as full [start, end) spans."""
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    ranges = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                    if e["name"] == name and e.get("cat") == "user_annotation")
    launch = {e["args"]["correlation"]: e["ts"] for e in events
              if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    kernels = [e for e in events if e.get("cat") == "kernel"]
    out = []
    for lo, hi in ranges:
        mine = [e for e in kernels if lo <= launch.get(e["args"].get("correlation"), -1) < hi]
        spans = [((e["ts"], e["ts"] + e["dur"]), "nccl" in e["name"].lower()) for e in mine]
        out.append(([s for s, c in spans if c], [s for s, c in spans if not c]))
    return out


def test_kernels_count_in_full_in_the_step_that_launched_them(a100):
    result = accounting.analyse(a100, 8, "cuda", step_range="## backward ##")
    expected = _by_launch(a100, "## backward ##")
    assert len(result["steps"]) == len(expected) == 6
    for step, (comm, compute) in zip(result["steps"], expected):
        assert comm, "each backward launches NCCL kernels in this trace"
        assert step["comm_ms"] == pytest.approx(accounting.length(comm) / 1e3)
        assert step["compute_ms"] == pytest.approx(accounting.length(compute) / 1e3)
        split = accounting.overlap_split(comm, compute)
        assert step["exposed_ms"] == pytest.approx(split["exposed"] / 1e3)
    assert result["unattributed_kernels"] == 0


def test_clipping_to_the_host_range_would_read_low(a100):
    # What the accounting did before: kernels cut at the host range's end. On this real trace
    # most of the optimizer's kernels run after its host range closed.
    steps = accounting.analyse(a100, 8, "cuda", step_range="## optimizer ##")["steps"]
    events = [e for e in a100["traceEvents"] if e.get("ph") == "X"]
    ranges = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                    if e["name"] == "## optimizer ##" and e.get("cat") == "user_annotation")
    for step, (lo, hi), (_, own) in zip(steps, ranges, _by_launch(a100, "## optimizer ##")):
        clipped = accounting.length(accounting.clip(own, lo, hi)) / 1e3
        assert step["compute_ms"] == pytest.approx(accounting.length(own) / 1e3)
        assert step["compute_ms"] > 0 and clipped < 0.5 * step["compute_ms"]


def test_bytes_and_calls_of_the_host_events(a100):
    steps = accounting.analyse(a100, 8, "cuda", step_range="## backward ##")["steps"]
    first = steps[0]["collectives"]
    assert first["all_reduce"]["calls"] == 3 and first["all_to_all"]["calls"] == 1
    assert first["all_reduce"]["bytes"] > 0  # from the recorded Input Dims and types


def test_device_copies_of_ranges_are_not_steps(v100):
    # Kineto copies `## backward ##` onto the device stream (gpu_user_annotation): five steps,
    # not ten, and each nccl:all_reduce host event counted once.
    result = accounting.analyse(v100, 1, "cuda", step_range="## backward ##")
    assert len(result["steps"]) == 5
    host = [e for e in v100["traceEvents"] if e.get("cat") == "user_annotation"]
    calls = sum(1 for e in host if e["name"] == "nccl:all_reduce")
    assert sum(s["collectives"]["all_reduce"]["calls"] for s in result["steps"]) <= calls
    assert all(s["collectives"]["all_reduce"]["calls"] == 5 for s in result["steps"])


def test_the_record_says_comm_includes_waiting(v100):
    result = accounting.analyse(v100, 1, "cuda", step_range="## backward ##")
    assert "waiting for the peers" in result["note"]


def test_no_step_range_is_a_clear_error(v100):
    with pytest.raises(ValueError, match="no 'lmperf.dist.step' range"):
        accounting.analyse(v100, 1, "cuda")


def test_profiled_steps_drain_the_device_inside_the_step(monkeypatch):
    # The last phase's lap runs inside the step's range (train_step), so the range closes
    # after the step's kernels ran.
    calls = []
    monkeypatch.setattr(train.dev, "synchronize", lambda device: calls.append(device))
    drain = train.DrainAtStepEnd(torch.device("cuda", 1))
    drain.start()
    for phase in train.PHASES:
        drain.lap(phase)
        assert calls == ([torch.device("cuda", 1)] if phase == train.PHASES[-1] else [])
