"""The in-process runner: build model, batch and regime for a RunSpec, measure, return a record.

One kind of measurement per pass: `warmup` untimed steps, `steps` timed steps (raw samples
kept), then one untimed step that records peak memory per phase (the same probe as `lmperf
memory`), and last the FLOPs of one step, counted on the meta device (a real untimed step for a
model that cannot run there).
"""

from __future__ import annotations

import time

from lmperf.core.envelope import Run, measured
from lmperf.core.heartbeat import beat
from lmperf.core.outcome import PREFLIGHT, first_line
from lmperf.kernels import flash_configs
from lmperf.measure.flops import (
    BACKWARD_MODES, COUNTED_CONVENTION, StepFlops, count_flops, reference_step_flops,
)
from lmperf.measure.stats import cpu_time, phase_summaries, spread_warning
from lmperf.measure.throughput import step_rates
from lmperf.model.checks import check_output
from lmperf.runtime import device as dev
from lmperf.runtime.device.clocks import CPU_CLOCK_COVERS
from lmperf.runtime.peaks import lookup_peak
from lmperf.workload.build import prepare
from lmperf.estimate.preflight import check_fits
from lmperf.model.checks import read_shape
from lmperf.workload.probe import PhaseProbe
from lmperf.workload.spec import RunSpec
from lmperf.workload.steps import NO_OBSERVER, PHASES

KIND = "bench"
STEP_TIMING = ("step: one device synchronisation per step, at its end (as lmperf train); phases: "
               "the boundaries inside the same steps, read without a synchronisation (CUDA "
               "events on the GPU's timeline), so they sum to the step; tokens/s, TFLOP/s and "
               "MFU from the median step")


def run_spec(spec: RunSpec) -> dict:
    """Run one spec in this process and return its record (status ok/oom/error/unsupported:
    never raises for a failure of the run itself, `core.envelope.measured`)."""
    return measured(KIND, spec, _measure, precision=spec.precision, first_stage=PREFLIGHT)


def _measure(spec: RunSpec, run: Run) -> dict:
    """The measurement, top to bottom: build (workload, model, runtime), time the steps, check
    a user's output, record the memory step, then the figures (peak, FLOPs, summaries, rates)."""
    device, stage = run.device, run.stage
    # a run that cannot fit: 'oom' in seconds (one micro-batch, at its checkpointing)
    check_fits(spec, device, run.regime, run.fields, spec.checkpoint)
    stage.now = "building the model"
    beat(stage=stage.now, steps_done=0, steps=spec.steps)  # where a killed job was
    prepared = prepare(spec, device, run.regime)
    state, step = prepared.state, prepared.step

    compile_s = None
    if spec.compile:
        # The first call of a compiled model compiles it (forward, and backward in the first
        # backward): one untimed step, its wall time recorded apart from the timed steps.
        stage.now = f"compiling the model (torch.compile, mode {spec.compile_mode})"
        beat(stage=stage.now, steps_done=0, steps=spec.steps)
        dev.synchronize(device)
        start = time.perf_counter()
        step(state, NO_OBSERVER)
        dev.synchronize(device)
        compile_s = time.perf_counter() - start

    # Nothing else runs the model before the warm-up steps, so that with --warmup 0 the first
    # timed step is the first step this process runs (its outlier stays in the raw samples).
    stage.now = f"warming up ({spec.warmup} steps)"
    beat(stage=stage.now, steps_done=0, steps=spec.steps)
    # One device sync per step, as `lmperf train` runs: the step time is the unsynchronised one
    # (tokens/s and MFU follow from it); the phases are its boundaries, read without a sync.
    clock = dev.PhaseClock(device, sync="step")  # warm-up steps run under the same clock
    with flash_configs.searching() as searches:  # flash-triton's launch search, if any: untimed
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
    check_output(state.model, state.inputs[:spec.batch], state.autocast, spec.vocab_size,
                 spec.model)

    stage.now = "recording peak memory (one untimed step)"
    probe = PhaseProbe(dev.PeakMemory(device))
    step(state, probe)
    name = dev.device_name(device)
    peak = lookup_peak(name, prepared.math_dtype) if device.type == "cuda" else None

    stage.now = "counting FLOPs (on the meta device)"
    try:
        counted, _ = prepared.count_flops()
        counted_on = "the meta device"
    except Exception as exc:  # e.g. a user model that cannot run on meta: count a real step
        stage.now = "counting FLOPs (one untimed step)"
        counted, _ = count_flops(lambda: step(state, NO_OBSERVER))
        counted_on = f"a real step ({type(exc).__name__} on the meta device: {first_line(exc)})"
    rows = spec.batch * spec.grad_accum  # sequences per step, every micro-batch
    if spec.model is None:  # the reference LM: one convention whatever --attention runs
        flops = reference_step_flops(counted, counted_on == "the meta device", spec.d_model,
                                     spec.num_layers, spec.d_ff, spec.vocab_size, rows,
                                     spec.context, spec.mode)
    else:
        flops = StepFlops(counted, f"torch.utils.flop_counter on {counted_on}", COUNTED_CONVENTION)

    timed = phase_summaries(samples)
    metrics: dict = {"timer": clock.kind, "timer_sync": clock.sync, "step_timing": STEP_TIMING,
                     "compile_s": compile_s, **timed,
                     "cpu_time": cpu_time(clock.cpu_kind, CPU_CLOCK_COVERS.get(clock.cpu_kind),
                                          cpu)}
    if (w := spread_warning({n: timed[f"{n}_ms"] for n in samples})):
        run.warnings.append(w)
    if not probe.memory.resettable:  # after the spread's warning, as before the envelope
        run.warnings.append("peak RSS could not be reset per phase here; memory peaks are "
                            "cumulative")
    rates = step_rates(rows * spec.context, timed["step_ms"], flops.flops,
                       peak.tflops if peak else None)
    metrics.update({
        "tokens_per_step": rates["tokens_per_step"],
        "tokens_per_s": rates["tokens_per_s"],
        "flops_per_step": flops.flops,
        "flops_per_step_analytic": flops.analytic,
        "flops_source": flops.source,
        "flops_convention": flops.convention,
        "flops_includes": "forward" + (" + backward" if spec.mode in BACKWARD_MODES else ""),
        "tflops": rates["tflops"],
        "math_dtype": prepared.math_dtype,
        "peak_tflops": peak.tflops if peak else None,
        "peak_source": peak.source if peak else None,
        "mfu": rates["mfu"],
        "memory": probe.result(),
    })
    if searches:
        metrics["autotune"] = searches
    shape = {"model_shape": read_shape(state.model)} if spec.model else {}  # not what it was handed
    return {"params": prepared.params, **shape, "metrics": metrics}
