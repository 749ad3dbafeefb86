"""The in-process runner: build model, batch and regime for a RunSpec, measure, return a record.

One kind of measurement per pass: an untimed FLOP-counting step, `warmup` untimed steps,
`steps` timed steps (raw samples kept), then one untimed step that records peak memory per phase.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Callable

import torch

from lmperf.bench.spec import RunSpec
from lmperf.bench.steps import NO_OBSERVER, PHASES, STEPS, Observer, StepState
from lmperf.errors import LmperfError
from lmperf.measure.flops import BACKWARD_MODES, analytic_flops, attention_flops_counted, count_flops
from lmperf.measure.stats import spread_warning, summarize
from lmperf.model.custom import build_model, check_logits, count_params
from lmperf.results.schema import make_record
from lmperf.runtime import device as dev
from lmperf.runtime import env as envmod
from lmperf.runtime.peaks import lookup_peak
from lmperf.runtime.precision import (
    Regime, autocast, compute_dtype, get_regime, grad_scaler, matmul_precision, slowness_warning,
    unsupported_reason,
)

KIND = "bench"
_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def run_spec(spec: RunSpec) -> dict:
    """Run one spec in this process and return its record (status ok/oom/error/unsupported).

    Never raises for a failure of the run itself: an out-of-memory error becomes an 'oom'
    record, any other exception an 'error' record with the exception's message.
    """
    device = torch.device(spec.device)
    regime = get_regime(spec.precision)
    environment = envmod.capture(device)

    def record(status: str, **fields: object) -> dict:
        return make_record(KIND, spec.to_dict(), status, environment, **fields)

    reason = unsupported_reason(regime, device)
    if reason:
        return record("unsupported", message=reason)
    warnings = [w for w in [slowness_warning(regime, device)] if w]
    stage = ["building the model"]  # updated as the run goes on, for error messages
    try:
        with matmul_precision(regime):
            params, metrics = _measure(spec, device, regime, stage, warnings)
            environment.update(dev.tf32_state())  # what was in force during the run
        return record("ok", params=params, metrics=metrics, warnings=warnings)
    except Exception as exc:  # the run failed; the sweep goes on
        if dev.is_oom(exc):
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return record("oom", message=f"out of memory while {stage[0]}: {first}",
                          warnings=warnings)
        message = f"{type(exc).__name__} while {stage[0]}: {exc}"
        extra = {} if isinstance(exc, LmperfError) else {"traceback": traceback.format_exc(limit=8)}
        return record("error", message=message, warnings=warnings, **extra)
    finally:
        dev.free_memory(device)


@dataclass
class Prepared:
    """A run ready to step: its state, the step function of its mode, and the parameter count."""

    state: StepState
    step: Callable[[StepState, Observer], None]
    params: int


def prepare(spec: RunSpec, device: torch.device, regime: Regime) -> Prepared:
    """Build model, random batch, optimizer and scaler for `spec` on `device` (seeded)."""
    dev.seed_all(spec.seed)
    with device:  # build directly on the device: no host copy of a large model
        model = build_model(spec.model_config(), spec.model)
    model.to(dtype=regime.param_dtype)
    gen = dev.make_generator(device, spec.seed)
    shape = (spec.batch_size, spec.context_length)
    inputs = torch.randint(0, spec.vocab_size, shape, generator=gen, device=device)
    targets = torch.randint(0, spec.vocab_size, shape, generator=gen, device=device)
    optimizer = None
    if spec.mode == "train-step":
        flags = {"fused": {"fused": True}, "foreach": {"foreach": True},
                 "loop": {"foreach": False}}[spec.optimizer]
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, **flags)
    state = StepState(model, inputs, targets, lambda: autocast(regime, device),
                      grad_scaler(regime, device), optimizer)
    return Prepared(state, STEPS[spec.mode], count_params(model))


def check_user_model(spec: RunSpec, state: StepState) -> None:
    """For a user's model, check once that its logits have shape (B, T, vocab)."""
    if spec.model is None:
        return
    with torch.no_grad(), state.autocast():
        out = state.model(state.inputs)
    check_logits(out, spec.batch_size, spec.context_length, spec.vocab_size, spec.model)


def _measure(spec: RunSpec, device: torch.device, regime: Regime, stage: list[str],
             warnings: list[str]) -> tuple[int, dict]:
    prepared = prepare(spec, device, regime)
    state, step, params = prepared.state, prepared.step, prepared.params

    stage[0] = "checking the model's output"
    check_user_model(spec, state)

    stage[0] = "counting FLOPs (one untimed step)"
    counted, per_op = count_flops(lambda: step(state, NO_OBSERVER))

    stage[0] = f"warming up ({spec.warmup} steps)"
    clock = dev.PhaseClock(device)
    for _ in range(spec.warmup):
        step(state, clock)

    stage[0] = f"measuring ({spec.steps} steps)"
    phases = PHASES[spec.mode]
    samples: dict[str, list[float]] = {p: [] for p in phases}
    samples["step"] = []
    for _ in range(spec.steps):
        step(state, clock)
        for p in phases:
            samples[p].append(clock.laps[p])
        samples["step"].append(clock.total_ms)

    stage[0] = "recording peak memory (one untimed step)"
    probe = _MemoryProbe(dev.PeakMemory(device))
    step(state, probe)

    metrics: dict = {"timer": clock.kind}
    for name in ("forward", "backward", "optimizer", "step"):
        metrics[f"{name}_ms"] = summarize(samples[name]) if name in samples else None
    if (w := spread_warning({n: metrics[f"{n}_ms"] for n in samples})):
        warnings.append(w)
    metrics.update(_throughput(spec, device, regime, metrics["step_ms"]["median"], counted, per_op))
    metrics["memory"] = probe.result()
    if not probe.memory.resettable:
        warnings.append("peak RSS could not be reset per phase here; memory peaks are cumulative")
    return params, metrics


class _MemoryProbe:
    """An observer that records the peak memory of each phase (reset at each boundary)."""

    def __init__(self, memory: dev.PeakMemory):
        self.memory = memory
        self.phases: dict[str, dict] = {}

    def start(self) -> None:
        dev.synchronize(self.memory.device)
        self.memory.reset()

    def lap(self, phase: str) -> None:
        dev.synchronize(self.memory.device)
        self.phases[phase] = self.memory.read()
        self.memory.reset()

    def result(self) -> dict:
        return {"kind": self.memory.kind, "unit": "MiB", "phases": self.phases}


def _throughput(spec: RunSpec, device: torch.device, regime: Regime, step_ms: float, counted: int,
                per_op: dict[str, int]) -> dict:
    """Tokens/s, FLOPs per step (counted, with the analytic check), TFLOP/s and MFU."""
    tokens = spec.batch_size * spec.context_length
    step_s = step_ms / 1e3
    analytic = None
    flops, source = counted, "torch.utils.flop_counter"
    if spec.model is None:
        est = analytic_flops(spec.d_model, spec.num_layers, spec.d_ff, spec.vocab_size,
                             spec.batch_size, spec.context_length, spec.mode)
        analytic = est.total
        if spec.attention == "sdpa" and attention_flops_counted(per_op) == 0:
            # The fused SDPA kernel on this device has no FLOP formula in the counter.
            flops += est.attention
            source = "torch.utils.flop_counter + analytic attention (SDPA kernel not counted here)"
    math_dtype = _DTYPE_NAMES.get(compute_dtype(regime), "fp32")
    if regime.tf32:
        math_dtype = "tf32"
    name = dev.device_name(device)
    peak = lookup_peak(name, math_dtype) if device.type == "cuda" else None
    tflops = flops / step_s / 1e12 if step_s > 0 else None
    return {
        "tokens_per_step": tokens,
        "tokens_per_s": tokens / step_s if step_s > 0 else None,
        "flops_per_step": flops,
        "flops_per_step_analytic": analytic,
        "flops_source": source,
        "flops_includes": "forward" + (" + backward" if spec.mode in BACKWARD_MODES else ""),
        "tflops": tflops,
        "math_dtype": math_dtype,
        "peak_tflops": peak.tflops if peak else None,
        "peak_source": peak.source if peak else None,
        "mfu": tflops / peak.tflops if (peak and tflops is not None) else None,
    }
