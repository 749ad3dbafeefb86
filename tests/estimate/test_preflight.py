"""The pre-flight: a run that cannot fit is an 'oom' row marked predicted, unless --force."""

from __future__ import annotations

import pytest
import torch

from lmperf.questions.bench.api import bench
from lmperf.runtime.precision import get_regime
from lmperf.estimate import preflight
from lmperf.workload.spec import RunSpec

GIB = 2**30


def _needs(monkeypatch, spec: RunSpec, device: str = "cpu") -> int:
    """What check_fits says `spec` needs, with 1 MiB of room."""
    _small_room(monkeypatch)
    fields: dict = {}
    with pytest.raises(preflight.PredictedOutOfMemory):
        preflight.check_fits(spec, torch.device(device), get_regime(spec.precision), fields)
    return fields["predicted"]["needs_bytes"]


@pytest.mark.parametrize("mode", ["forward", "train-step"])
@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_it_needs_what_memory_estimate_says(monkeypatch, mode, precision):
    """One answer to "fits": the pre-flight's need is memory --estimate's simulated step (peak,
    and on CUDA the allowance), to the byte."""
    from lmperf.estimate.simulate import simulate_step

    for device in ("cpu", "cuda"):
        spec = RunSpec.from_size("mini", context=64, batch=2, mode=mode, precision=precision,
                                 optimizer="fused", device=device)
        assert _needs(monkeypatch, spec, device) == pytest.approx(
            simulate_step(spec).total_bytes, abs=1)


def test_10b_forward_needs_more_than_this_machine(monkeypatch):
    spec = RunSpec.from_size("10B", context=128, batch=4, mode="forward")
    assert _needs(monkeypatch, spec) > 47 * GIB


def test_available_on_the_cpu_is_positive_and_named():
    free, what = preflight.available(torch.device("cpu"))
    assert free > 0 and what


def _small_room(monkeypatch):
    monkeypatch.setattr(preflight, "available", lambda device: (2**20, "under --max-memory-gib"))


def test_a_job_that_cannot_fit_is_a_predicted_oom_row_and_force_runs_it(monkeypatch):
    _small_room(monkeypatch)
    request = dict(size="tiny", context=16, batch=2, precision="fp32", warmup=0, steps=1,
                   inline=True)
    (rec,) = bench(**request).records
    assert rec["status"] == "oom"
    assert "predicted" in rec["message"] and "GiB over" in rec["message"]
    assert "--force" in rec["message"]
    assert rec["predicted"]["needs_bytes"] > rec["predicted"]["available_bytes"] == 2**20
    (forced,) = bench(**request, force=True).records
    assert forced["status"] == "ok", forced["message"]
    assert "predicted" not in forced


def test_a_memory_job_that_cannot_fit_is_predicted(monkeypatch):
    from lmperf.questions.memory.api import memory

    _small_room(monkeypatch)
    records = memory("tiny", context=16, batch=2, mode="forward", inline=True).records
    phases = [r for r in records if r["spec"]["analysis"] == "phases"]
    assert phases and all(r["status"] == "oom" and "predicted" in r["message"] for r in phases)
