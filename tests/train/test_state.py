"""The step as train runs it (THE workload train step on a train state): call order, the
optimizer outside autocast, dtypes per regime, the grad norm, the LR schedule, the spec's checks."""

from __future__ import annotations

import pytest
import torch

from lmperf.core.vocabulary import DEFAULTS
from lmperf.errors import SpecError
from lmperf.runtime.precision import get_regime
from lmperf.questions.train.data import Batches, load_builtin
from lmperf.questions.train.spec import TrainSpec
from lmperf.questions.train.state import build_state
from tests.train.faults import nan_loss_at
from lmperf.workload.steps import NO_OBSERVER, train_step

CPU = torch.device("cpu")


def _spec(precision: str = "fp32", **kw) -> TrainSpec:
    base = {"context": 16, "batch": 2, "steps": 4, "lr_warmup": 1}
    return TrainSpec.from_size("tiny", precision, **{**base, **kw})


def _step(state, spec: TrainSpec, step: int = 1):
    state.inputs, state.targets = Batches(load_builtin(5000), spec.batch, spec.context, 0).next()
    state.step_number = step
    return train_step(state, NO_OBSERVER)


def test_step_order_and_optimizer_outside_autocast(monkeypatch):
    spec = _spec()
    state, _ = build_state(spec, get_regime("fp16-mixed"), CPU)
    calls = []

    def spy(obj, name, before=None):
        original = getattr(obj, name)

        def wrapped(*args, **kwargs):
            calls.append(name)
            if before:
                before()
            return original(*args, **kwargs)
        monkeypatch.setattr(obj, name, wrapped)

    def not_in_autocast():
        assert not torch.is_autocast_enabled("cpu"), "optimizer.step ran inside autocast"

    spy(state.optimizer, "zero_grad")
    spy(state.scaler, "scale")
    spy(state.scaler, "unscale_")
    spy(torch.nn.utils, "clip_grad_norm_")
    spy(state.scaler, "step")
    spy(state.optimizer, "step", before=not_in_autocast)
    spy(state.scaler, "update")
    out = _step(state, spec)
    # zero_grad closes the step (the first step starts with no gradients): the same order as
    # zero_grad first, one step later
    assert calls == ["scale", "unscale_", "clip_grad_norm_", "step", "step", "update", "zero_grad"]
    assert out.loss.dtype == torch.float32 and torch.isfinite(out.grad_norm)
    assert all(p.grad is None for p in state.model.parameters())


@pytest.mark.parametrize("regime,param_dtype", [
    ("fp32", torch.float32), ("bf16-mixed", torch.float32), ("fp16-mixed", torch.float32),
    ("bf16-true", torch.bfloat16), ("fp16-true", torch.float16),
])
def test_params_and_optimizer_state_dtype(regime, param_dtype):
    spec = _spec()
    state, n = build_state(spec, get_regime(regime), CPU)
    _step(state, spec)
    assert n > 0
    for p in state.model.parameters():
        assert p.dtype == param_dtype
        assert state.optimizer.state[p]["exp_avg"].dtype == param_dtype
        assert state.optimizer.state[p]["exp_avg_sq"].dtype == param_dtype


def test_every_regime_starts_from_the_same_weights():
    spec = _spec()
    a, _ = build_state(spec, get_regime("fp32"), CPU)
    b, _ = build_state(spec, get_regime("bf16-true"), CPU)
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(pa.to(torch.bfloat16), pb)


def test_grad_norm_is_after_unscaling():
    """With loss scaling the recorded norm is the true gradient's, not S times it."""
    spec = _spec(clip=0.0)
    norms = {}
    for regime in ("fp32", "fp16-mixed"):
        state, _ = build_state(spec, get_regime(regime), CPU)
        norms[regime] = _step(state, spec).grad_norm.item()
    assert state.scaler.get_scale() == 65536.0
    assert norms["fp16-mixed"] == pytest.approx(norms["fp32"], rel=1e-2)


def test_clip_zero_measures_without_clipping():
    state, _ = build_state(_spec(clip=0.0), get_regime("fp32"), CPU)
    assert state.clip == float("inf")


def test_the_fault_sees_the_step_number():
    spec = _spec()
    state, _ = build_state(spec, get_regime("fp32"), CPU, fault=nan_loss_at(2))
    assert torch.isfinite(_step(state, spec, step=1).loss)
    assert torch.isnan(_step(state, spec, step=2).loss)


def test_lr_schedule_warms_up_then_decays_to_floor():
    spec = _spec(steps=100, lr_warmup=10, lr=1e-3, min_lr_ratio=0.1)
    assert spec.lr_at(1) == pytest.approx(1e-4) and spec.lr_at(10) == pytest.approx(1e-3)
    assert spec.lr_at(100) == pytest.approx(1e-4)
    lrs = [spec.lr_at(s) for s in range(10, 101)]
    assert all(x >= y for x, y in zip(lrs, lrs[1:]))
    assert _spec(lr_warmup=0).lr_at(1) == pytest.approx(_spec().lr)


def test_spec_round_trips_and_fills_new_fields():
    spec = _spec(data="book.txt", threads=1)
    assert TrainSpec.from_dict(spec.to_dict()) == spec
    old = {k: v for k, v in spec.to_dict().items() if k not in ("threads", "tokens")}
    assert TrainSpec.from_dict(old).threads == 0
    with pytest.raises(SpecError, match="unknown TrainSpec field"):
        TrainSpec.from_dict({**spec.to_dict(), "regime": "fp32"})


@pytest.mark.parametrize("kw,match", [
    ({"steps": 0}, "--steps must be a positive integer"),
    ({"batch": -1}, "--batch"),
    ({"lr": 0.0}, "--lr must be a positive number"),
    ({"lr": float("nan")}, "--lr"),
    ({"clip": -1.0}, "--clip"),
    ({"lr_warmup": -1}, "--lr-warmup"),
    ({"eval_interval": 0}, "--eval-interval"),
    ({"seed": -3}, "--seed"),
    ({"threads": -1}, "--threads"),
    ({"precision": "fp8"}, "unknown precision 'fp8'"),
    ({"data": "a.txt", "tokens": "b.bin"}, "not both"),
])
def test_spec_rejects_bad_values(kw, match):
    with pytest.raises(SpecError, match=match):
        _spec(**kw)


def test_spec_rejects_an_unknown_size():
    with pytest.raises(SpecError, match="unknown size 'huge'"):
        TrainSpec.from_size("huge", "fp32")


def test_cpu_defaults_are_fp32_and_bf16_only():
    assert DEFAULTS["train"]["cpu"]["precision"] == ["fp32", "bf16-mixed", "bf16-true"]
