"""The in-process runner: build model, batch and regime for a RunSpec, measure, return a record.

One kind of measurement per pass: `warmup` untimed steps, `steps` timed steps (raw samples
kept), then an untimed FLOP-counting step and one untimed step that records peak memory per
phase (the same probe as `lmperf memory`).
"""

from __future__ import annotations

import time

import torch

from lmperf.core.heartbeat import beat
from lmperf.core.outcome import Stage, failure, first_line
from lmperf.measure.flops import (
    BACKWARD_MODES, COUNTED_CONVENTION, StepFlops, count_flops, reference_step_flops,
)
from lmperf.measure.stats import spread_warning, summarize
from lmperf.results.schema import make_record
from lmperf.runtime import device as dev
from lmperf.runtime import env as envmod
from lmperf.runtime.device.clocks import CPU_CLOCK_COVERS
from lmperf.runtime.peaks import lookup_peak
from lmperf.runtime.precision import (
    Regime, compute_dtype, get_regime, matmul_precision, slowness_warning, unsupported_reason,
)
from lmperf.workload.build import check_user_model, meta_flops, prepare
from lmperf.workload.probe import PhaseProbe
from lmperf.workload.spec import RunSpec
from lmperf.workload.steps import NO_OBSERVER, PHASES
from lmperf.measure.throughput import tokens_per_s

KIND = "bench"
STEP_TIMING = ("step: one device synchronisation per step, at its end (as lmperf train); phases: "
               "the boundaries inside the same steps, read without a synchronisation (CUDA "
               "events on the GPU's timeline), so they sum to the step; tokens/s, TFLOP/s and "
               "MFU from the median step")
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
    environment["torch_threads"] = torch.get_num_threads()
    stage = Stage("building the model")
    try:
        with matmul_precision(regime):
            params, metrics = _measure(spec, device, regime, stage, warnings)
            environment.update(dev.tf32_state())  # what was in force during the run
        return record("ok", params=params, metrics=metrics, warnings=warnings)
    except Exception as exc:  # the run failed; the sweep goes on
        return record(**failure(exc, stage), warnings=warnings)
    finally:
        dev.free_memory(device)


def _measure(spec: RunSpec, device: torch.device, regime: Regime, stage: Stage,
             warnings: list[str]) -> tuple[int, dict]:
    prepared = prepare(spec, device, regime)
    state, step, params = prepared.state, prepared.step, prepared.params

    compile_s = None
    if spec.compile:
        # The first call of a compiled model compiles it (forward, and backward in the first
        # backward): one untimed step, its wall time recorded apart from the timed steps.
        stage.now = f"compiling the model (torch.compile, mode {spec.compile_mode})"
        dev.synchronize(device)
        start = time.perf_counter()
        step(state, NO_OBSERVER)
        dev.synchronize(device)
        compile_s = time.perf_counter() - start

    # Nothing else runs the model before the warm-up steps, so that with --warmup 0 the first
    # timed step is the first step this process runs (its outlier stays in the raw samples).
    stage.now = f"warming up ({spec.warmup} steps)"
    # One device sync per step, as `lmperf train` runs: the step time is the unsynchronised one
    # (tokens/s and MFU follow from it); the phases are its boundaries, read without a sync.
    clock = dev.PhaseClock(device, sync="step")  # warm-up steps run under the same clock
    for _ in range(spec.warmup):
        step(state, clock)

    stage.now = f"measuring ({spec.steps} steps)"
    phases = PHASES[spec.mode]
    samples: dict[str, list[float]] = {p: [] for p in (*phases, "step")}
    cpu: dict[str, list[float]] = {p: [] for p in (*phases, "step")}  # CPU devices only
    for _ in range(spec.steps):
        step(state, clock)
        laps, cpu_laps = clock.laps, clock.cpu_laps
        for p in phases:
            samples[p].append(laps[p])
            if clock.cpu_kind:
                cpu[p].append(cpu_laps[p])
        samples["step"].append(clock.total_ms)
        if clock.cpu_kind:
            cpu["step"].append(clock.cpu_total_ms)
        # if the job is killed (--timeout), its row still says how far it got and what it timed
        beat(stage="timed steps", steps_done=len(samples["step"]), steps=spec.steps,
             step_ms=samples["step"])

    stage.now = "checking the model's output"
    check_user_model(spec, state)

    stage.now = "counting FLOPs (on the meta device)"
    try:
        counted, per_op = meta_flops(spec)
        counted_on = "the meta device"
    except Exception as exc:  # e.g. a user model that cannot run on meta: count a real step
        stage.now = "counting FLOPs (one untimed step)"
        counted, per_op = count_flops(lambda: step(state, NO_OBSERVER))
        counted_on = f"a real step ({type(exc).__name__} on the meta device: {first_line(exc)})"

    stage.now = "recording peak memory (one untimed step)"
    probe = PhaseProbe(dev.PeakMemory(device))
    step(state, probe)

    metrics: dict = {"timer": clock.kind, "timer_sync": clock.sync, "step_timing": STEP_TIMING,
                     "compile_s": compile_s}
    for name in ("forward", "backward", "optimizer", "step"):
        metrics[f"{name}_ms"] = summarize(samples[name]) if name in samples else None
    metrics["cpu_time"] = cpu_time(clock.cpu_kind, cpu)
    if (w := spread_warning({n: metrics[f"{n}_ms"] for n in samples})):
        warnings.append(w)
    metrics.update(_throughput(spec, device, regime, metrics["step_ms"]["median"], counted, per_op,
                               counted_on))
    metrics["memory"] = probe.result()
    if not probe.memory.resettable:
        warnings.append("peak RSS could not be reset per phase here; memory peaks are cumulative")
    return params, metrics


def cpu_time(kind: str | None, samples: dict[str, list[float]]) -> dict | None:
    """The CPU-time figures of a run beside its wall times: which clock (`PhaseClock.cpu_kind`),
    what it covers, and a `summarize()` dict per phase ('<phase>_ms', CPU milliseconds, raw
    samples kept). None on CUDA, where the host's CPU time is not the work's."""
    if kind is None:
        return None
    out: dict = {"clock": kind, "covers": CPU_CLOCK_COVERS[kind]}
    for name in ("forward", "backward", "optimizer", "step"):  # as the wall times: None if untimed
        out[f"{name}_ms"] = summarize(samples[name]) if samples.get(name) else None
    return out


def _throughput(spec: RunSpec, device: torch.device, regime: Regime, step_ms: float, counted: int,
                per_op: dict[str, int], counted_on: str) -> dict:
    """Tokens/s, FLOPs per step (counted, with the analytic check), TFLOP/s and MFU."""
    tokens = spec.batch * spec.context
    step_s = step_ms / 1e3
    if spec.model is None:  # the reference LM: one convention whatever --attention runs
        fl = reference_step_flops(counted, counted_on == "the meta device", spec.d_model,
                                  spec.num_layers, spec.d_ff, spec.vocab_size, spec.batch,
                                  spec.context, spec.mode)
    else:
        fl = StepFlops(counted, f"torch.utils.flop_counter on {counted_on}", COUNTED_CONVENTION)
    flops = fl.flops
    math_dtype = _DTYPE_NAMES.get(compute_dtype(regime), "fp32")
    if regime.tf32:
        math_dtype = "tf32"
    name = dev.device_name(device)
    peak = lookup_peak(name, math_dtype) if device.type == "cuda" else None
    tflops = flops / step_s / 1e12 if step_s > 0 else None
    return {
        "tokens_per_step": tokens,
        "tokens_per_s": tokens_per_s(tokens, step_ms),
        "flops_per_step": flops,
        "flops_per_step_analytic": fl.analytic,
        "flops_source": fl.source,
        "flops_convention": fl.convention,
        "flops_includes": "forward" + (" + backward" if spec.mode in BACKWARD_MODES else ""),
        "tflops": tflops,
        "math_dtype": math_dtype,
        "peak_tflops": peak.tflops if peak else None,
        "peak_source": peak.source if peak else None,
        "mfu": tflops / peak.tflops if (peak and tflops is not None) else None,
    }
