"""Capturing a profile with torch.profiler: the same step as the benchmark, with ranges on.

`warmup` untimed steps, `steps` timed steps without the profiler (the baseline), then `steps`
profiled steps after one discarded profiler warm-up step, so the trace holds the measured steps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from lmperf.core.outcome import Stage
from lmperf.model.checks import check_output
from lmperf.workload.build import prepare
from lmperf.workload.spec import RunSpec
from lmperf.workload.steps import NO_OBSERVER, PHASES
from lmperf.questions.profile.annotate import WARMUP, annotate, annotate_attention
from lmperf.runtime import device as dev
from lmperf.runtime.precision import get_regime, matmul_precision


@dataclass
class Capture:
    """What a capture measured.

    Attributes:
        params: parameter count of the model.
        unprofiled_ms, profiled_ms: phase -> per-step milliseconds ('step' included), without
            and with the profiler running, from the same PhaseClock.
        capture_s: wall time of the profiled steps (profiler start to trace export excluded).
    """

    params: int
    unprofiled_ms: dict[str, list[float]] = field(default_factory=dict)
    profiled_ms: dict[str, list[float]] = field(default_factory=dict)
    capture_s: float = 0.0
    export_s: float = 0.0
    compile_s: float | None = None  # --compile: the compiling first step


def capture(spec: RunSpec, trace_path: Path, stage: Stage | None = None) -> Capture:
    """Run `spec` under torch.profiler and write its trace; raises what the run raises.

    `stage` is kept up to date with what the capture is doing (for the message of a failure).
    """
    stage = stage or Stage()
    device = torch.device(spec.device)
    regime = get_regime(spec.precision)
    with matmul_precision(regime):
        stage.now = "building the model"
        prepared = prepare(spec, device, regime)
        state, step = prepared.state, prepared.step
        check_output(state.model, state.inputs, state.autocast, spec.vocab_size, spec.model)
        annotate_attention(state.model)  # ranges around the naive attention's three steps
        state.annotate = annotate  # and around every phase
        result = Capture(prepared.params)
        clock = dev.PhaseClock(device)
        if spec.compile:  # the first call compiles: one step, timed apart, before the warm-up
            stage.now = f"compiling the model (torch.compile, mode {spec.compile_mode})"
            dev.synchronize(device)
            start = time.perf_counter()
            with annotate(WARMUP):
                step(state, NO_OBSERVER)
            dev.synchronize(device)
            result.compile_s = time.perf_counter() - start
        stage.now = f"warming up ({spec.warmup} steps)"
        with annotate(WARMUP):
            for _ in range(spec.warmup):
                step(state, clock)
        stage.now = f"timing {spec.steps} steps without the profiler"
        result.unprofiled_ms = _timed(step, state, clock, spec)

        activities = [ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        phases = PHASES[spec.mode] + ("step",)
        result.profiled_ms = {p: [] for p in phases}
        trace_path.parent.mkdir(parents=True, exist_ok=True)

        def export(prof: profile) -> None:
            # Called when the active cycle ends; the events are cleared right after.
            stage.now = "exporting the trace"
            start = time.perf_counter()
            prof.export_chrome_trace(str(trace_path))
            result.export_s = time.perf_counter() - start

        with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=spec.steps, repeat=1),
                     on_trace_ready=export, record_shapes=False, with_stack=False) as prof:
            stage.now = f"profiling {spec.steps} steps"
            start = time.perf_counter()
            for i in range(spec.steps + 1):  # +1: the profiler's own warm-up step, discarded
                step(state, clock)
                if i > 0:
                    _append(result.profiled_ms, clock)
                prof.step()
            result.capture_s = time.perf_counter() - start - result.export_s
    if not trace_path.exists():
        raise RuntimeError(f"torch.profiler wrote no trace to {trace_path}")
    return result


def _timed(step, state, clock: dev.PhaseClock, spec: RunSpec) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {p: [] for p in PHASES[spec.mode] + ("step",)}
    for _ in range(spec.steps):
        step(state, clock)
        _append(out, clock)
    return out


def _append(out: dict[str, list[float]], clock: dev.PhaseClock) -> None:
    for phase, ms in clock.laps.items():
        out[phase].append(ms)
    out["step"].append(clock.total_ms)
