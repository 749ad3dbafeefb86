"""The pre-flight bound: a run that cannot fit is an 'oom' row marked predicted, unless --force."""

from __future__ import annotations

import pytest
import torch

from lmperf.questions.bench.api import bench
from lmperf.questions.memory.estimate import estimate
from lmperf.runtime.precision import get_regime
from lmperf.workload import preflight
from lmperf.workload.spec import RunSpec

GIB = 2**30


@pytest.mark.parametrize("mode", ["forward", "forward-backward", "train-step"])
@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed", "bf16-true"])
def test_the_bound_is_a_lower_bound_of_the_estimate(mode, precision):
    spec = RunSpec.from_size("mini", context=64, batch=2, mode=mode, precision=precision)
    bound = preflight.lower_bound(spec, get_regime(precision))
    est = estimate(spec.model_config(), 2, 64, precision, mode=mode)
    # parameters throughout, AdamW's two moments from the first step, then the larger of the
    # logits (until the loss's backward) and the gradients (from then on): never all at once
    moments = 2 * est.param_bytes if mode == "train-step" else 0
    logits = 2 * 64 * spec.vocab_size * (4 if precision == "fp32" else 2)
    assert bound.bytes == est.param_bytes + moments + max(logits, est.grad_bytes)
    assert bound.bytes < est.total_bytes  # below the analytic sum, which adds everything


def test_10b_forward_needs_more_than_this_machine():
    spec = RunSpec.from_size("10B", context=128, batch=4, mode="forward")
    assert preflight.lower_bound(spec, get_regime("fp32")).bytes > 47 * GIB


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


@pytest.mark.parametrize("mode", ["forward", "forward-backward", "train-step"])
@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_the_bound_is_below_the_simulated_peak(mode, precision):
    # the simulator reproduces torch's MemTracker to the byte (docs/accuracy.md): a lower bound
    # above it would refuse runs that fit
    from lmperf.estimate.simulate import simulate_step

    for size, context in (("tiny", 512), ("mini", 128)):
        spec = RunSpec.from_size(size, context=context, batch=4, mode=mode, precision=precision,
                                 optimizer="fused")
        bound = preflight.lower_bound(spec, get_regime(precision)).bytes
        assert bound <= simulate_step(spec).peak_bytes
