"""What a bench record's times are: the unsynchronised step (one sync per step, as train runs),
its phase boundaries, and the CPU time of the same phases beside the wall time."""

from __future__ import annotations

import pytest
import torch

from lmperf.questions.bench.job import run_spec
from lmperf.workload.spec import RunSpec

TINY = dict(context=16, batch=2, warmup=1, steps=3)


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("n, clock, mode, phases", [
    (1, "thread_time", "forward-backward", ("forward", "backward")),
    (2, "process_time", "train-step", ("forward", "backward", "optimizer")),
])
def test_a_cpu_record_has_cpu_time_beside_the_unsynchronised_step(threads, n, clock, mode, phases):
    torch.set_num_threads(n)  # what the launcher does for --threads N
    rec = run_spec(RunSpec.from_size("tiny", threads=n, mode=mode, **TINY))
    assert rec["status"] == "ok", rec.get("message")
    m = rec["metrics"]
    # one sync per step; the phases are its boundaries and tile it; tokens/s from the step
    assert m["timer_sync"] == "step" and "one device synchronisation per step" in m["step_timing"]
    for i, total in enumerate(m["step_ms"]["samples"]):
        assert total == pytest.approx(sum(m[f"{p}_ms"]["samples"][i] for p in phases), rel=1e-6)
    assert m["tokens_per_s"] == pytest.approx(32 / (m["step_ms"]["median"] / 1e3))
    cpu = m["cpu_time"]
    assert cpu["clock"] == clock
    assert ("measuring thread" if n == 1 else "all threads") in cpu["covers"]
    for name in ("forward", "backward", "optimizer", "step"):
        if name in phases or name == "step":
            assert cpu[f"{name}_ms"]["n"] == 3 and all(x > 0 for x in cpu[f"{name}_ms"]["samples"])
        else:
            assert cpu[f"{name}_ms"] is None and m[f"{name}_ms"] is None
    for i, total in enumerate(cpu["step_ms"]["samples"]):
        assert total == pytest.approx(sum(cpu[f"{p}_ms"]["samples"][i] for p in phases), rel=1e-6)
    if n == 1:  # one thread cannot run for longer than the wall clock did
        for wall, c in zip(m["step_ms"]["samples"], cpu["step_ms"]["samples"]):
            assert c <= wall + 0.5
