"""The step: call order, the optimiser outside autocast, dtypes per regime, the LR schedule."""

from __future__ import annotations

import pytest
import torch

from lmperf.errors import SpecError
from lmperf.runtime.precision import get_regime
from lmperf.train import step as step_mod
from lmperf.train.config import CPU_DEFAULTS, TrainConfig
from lmperf.train.data import Batches, load_builtin
from lmperf.train.step import build_state, train_step

CPU = torch.device("cpu")


def _cfg(**kw) -> TrainConfig:
    base = {"context": 16, "batch": 2, "steps": 4, "warmup_steps": 1}
    return TrainConfig.from_size("tiny", ("fp32",), **{**base, **kw})


def _batch(cfg: TrainConfig):
    return Batches(load_builtin(5000), cfg.batch, cfg.context, 0).next()


def test_step_order_and_optimizer_outside_autocast(monkeypatch):
    cfg = _cfg()
    state, _ = build_state(cfg, get_regime("fp16-mixed"), CPU)
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
    out = train_step(state, *_batch(cfg), step=1)
    assert calls == ["zero_grad", "scale", "unscale_", "clip_grad_norm_", "step", "step", "update"]
    assert out.loss.dtype == torch.float32 and torch.isfinite(out.grad_norm)


@pytest.mark.parametrize("regime,param_dtype", [
    ("fp32", torch.float32), ("bf16-mixed", torch.float32), ("fp16-mixed", torch.float32),
    ("bf16-true", torch.bfloat16), ("fp16-true", torch.float16),
])
def test_params_and_optimizer_state_dtype(regime, param_dtype):
    cfg = _cfg()
    state, n = build_state(cfg, get_regime(regime), CPU)
    train_step(state, *_batch(cfg), step=1)
    assert n > 0
    for p in state.model.parameters():
        assert p.dtype == param_dtype
        assert state.optimizer.state[p]["exp_avg"].dtype == param_dtype
        assert state.optimizer.state[p]["exp_avg_sq"].dtype == param_dtype


def test_every_regime_starts_from_the_same_weights():
    cfg = _cfg()
    a, _ = build_state(cfg, get_regime("fp32"), CPU)
    b, _ = build_state(cfg, get_regime("bf16-true"), CPU)
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(pa.to(torch.bfloat16), pb)


def test_grad_norm_is_after_unscaling():
    """With loss scaling the recorded norm is the true gradient's, not S times it."""
    cfg = _cfg(clip=0.0)
    norms = {}
    for regime in ("fp32", "fp16-mixed"):
        state, _ = build_state(cfg, get_regime(regime), CPU)
        norms[regime] = train_step(state, *_batch(cfg), step=1).grad_norm.item()
    assert state.scaler.get_scale() == 65536.0
    assert norms["fp16-mixed"] == pytest.approx(norms["fp32"], rel=1e-2)


def test_clip_zero_measures_without_clipping():
    state, _ = build_state(_cfg(clip=0.0), get_regime("fp32"), CPU)
    assert state.clip == float("inf")


def test_lr_schedule_warms_up_then_decays_to_floor():
    cfg = _cfg(steps=100, warmup_steps=10, lr=1e-3, min_lr_ratio=0.1)
    assert cfg.lr_at(1) == pytest.approx(1e-4) and cfg.lr_at(10) == pytest.approx(1e-3)
    assert cfg.lr_at(100) == pytest.approx(1e-4)
    lrs = [cfg.lr_at(s) for s in range(10, 101)]
    assert all(x >= y for x, y in zip(lrs, lrs[1:]))
    assert _cfg(warmup_steps=0).lr_at(1) == pytest.approx(_cfg().lr)


def test_nan_fault_only_at_its_step():
    fault = step_mod.nan_loss_at(3)
    one = torch.tensor(1.0)
    assert fault(2, one) == 1.0 and torch.isnan(fault(3, one))


@pytest.mark.parametrize("kw,match", [
    ({"steps": 0}, "--steps must be a positive integer"),
    ({"batch": -1}, "--batch"),
    ({"lr": 0.0}, "--lr must be a positive number"),
    ({"lr": float("nan")}, "--lr"),
    ({"clip": -1.0}, "--clip"),
    ({"warmup_steps": -1}, "--warmup-steps"),
    ({"eval_interval": 0}, "--eval-interval"),
    ({"seed": -3}, "--seed"),
])
def test_config_rejects_bad_values(kw, match):
    with pytest.raises(SpecError, match=match):
        _cfg(**kw)


def test_config_rejects_bad_names():
    with pytest.raises(SpecError, match="unknown regime 'fp8'"):
        TrainConfig.from_size("tiny", ("fp8",))
    with pytest.raises(SpecError, match="unknown size 'huge'"):
        TrainConfig.from_size("huge", ("fp32",))
    with pytest.raises(SpecError, match="listed twice"):
        TrainConfig.from_size("tiny", ("fp32", "fp32"))
    with pytest.raises(SpecError, match="at least one"):
        TrainConfig.from_size("tiny", ())


def test_cpu_defaults_are_fp32_and_bf16_only():
    cfg = TrainConfig.from_size(CPU_DEFAULTS["size"], CPU_DEFAULTS["regimes"])
    assert cfg.regimes == ("fp32", "bf16-mixed", "bf16-true")
    assert not any("fp16" in r for r in cfg.regimes)
