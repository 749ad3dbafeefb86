"""Clocks and memory probes: per-phase timing (on CUDA its host clock also proves that
`synchronize` waits for the GPU: the phases synchronise), per-phase peak memory.

Each check drives THE training step (`workload.steps.train_step`) of the `tiny` model with the
observer lmperf's commands use (PhaseClock, PhaseProbe), so a pass here means the measuring
path of `bench`, `profile`, `memory` and `train` works on this device.
"""

from __future__ import annotations

import time

import torch

from lmperf.questions.doctor.checks import Context, Outcome, fail, ok, passed
from lmperf.runtime import device as dev
from lmperf.workload.build import Prepared
from lmperf.units import MIB

PHASES = ("forward", "backward", "optimizer")
CONTEXT, BATCH = 32, 2
ATTEMPTS = 3
"""Timed steps per clock check; the one that agrees best is kept (one step can be preempted on
a shared machine, which delays the outer clock and the step's clock alike, but not always)."""


def tiny_step(device: torch.device, precision: str = "fp32", warmup: int = 1) -> Prepared:
    """The `tiny` model's training step on `device` (AdamW as `auto` picks it), warmed up."""
    from lmperf.runtime.precision import get_regime
    from lmperf.workload.build import prepare, resolve_optimizer
    from lmperf.workload.spec import RunSpec
    from lmperf.workload.steps import NO_OBSERVER

    spec = RunSpec.from_size("tiny", context=CONTEXT, batch=BATCH, device=device.type,
                             precision=precision, optimizer=resolve_optimizer("auto", device))
    prepared = prepare(spec, device, get_regime(precision))
    for _ in range(warmup):
        prepared.step(prepared.state, NO_OBSERVER)
    dev.synchronize(device)
    return prepared


def check_phase_clock(ctx: Context) -> Outcome:
    """PhaseClock on the tiny train step: its phases sum to its step, and the step agrees with
    an outer host clock around it (perf_counter on the CPU; on CUDA the events' time against
    the host time of the synchronised step)."""
    device = ctx.device
    prepared = tiny_step(device)
    best = None
    for _ in range(ATTEMPTS):
        clock = dev.PhaseClock(device)
        dev.synchronize(device)
        begin = time.perf_counter()
        prepared.step(prepared.state, clock)
        outer_ms = (time.perf_counter() - begin) * 1e3
        gap = outer_ms - clock.total_ms
        if best is None or abs(gap) < abs(best[2]):
            best = (clock, outer_ms, gap)
    clock, outer_ms, gap = best
    laps = ", ".join(f"{p} {clock.laps.get(p, float('nan')):.2f}" for p in PHASES)
    result = f"{clock.kind}: {laps} = {clock.total_ms:.2f} ms; host clock {outer_ms:.2f} ms"
    if list(clock.laps) != list(PHASES) or min(clock.laps.values()) <= 0:
        return fail(result, f"expected positive laps for {', '.join(PHASES)}")
    if abs(sum(clock.laps.values()) - clock.total_ms) > 1e-3:
        return fail(result, "the phases must sum to the step")
    # The clock's window lies inside the outer one; what is outside is the observer's first
    # synchronisation and call overhead (CPU: microseconds; CUDA: also the launch of the first
    # event), so the two agree to a millisecond or 15%, whichever is larger.
    tolerance_ms = max(1.0, 0.15 * outer_ms)
    return passed(-0.05 <= gap <= tolerance_ms, result,
                  f"phases sum to the step; step within {tolerance_ms:.1f} ms of the host clock",
                  laps_ms=clock.laps, total_ms=clock.total_ms, host_ms=outer_ms, gap_ms=gap)


def check_cpu_peaks(ctx: Context) -> Outcome:
    """The CPU's per-phase peak: /proc/self/clear_refs resets the peak RSS (VmHWM), a new
    allocation shows in it, and glibc's malloc_trim is there to hand freed memory back."""
    from lmperf.workload import probe

    memory = dev.PeakMemory(torch.device("cpu"))
    memory.reset()
    if not memory.resettable:
        return fail("/proc/self/clear_refs is not writable",
                    "per-phase CPU peaks would be cumulative (the record says resettable=False)")
    before = memory.read()["rss"]
    if before is None:
        return fail("no /proc/self/status", "CPU peaks are read from VmHWM")
    big = torch.ones(32 * MIB)  # 128 MiB of float32, every page touched
    during = memory.read()["rss"]
    del big
    probe.release_freed_memory()
    memory.reset()
    after = memory.read()["rss"]
    trim = probe._LIBC is not None
    result = (f"peak RSS {before:.0f} -> {during:.0f} MiB with 128 MiB allocated, {after:.0f} "
              "after free + reset; malloc_trim " + ("available" if trim else "missing"))
    return passed(during - before >= 100 and during - after >= 100 and trim, result,
                  "peak rises with an allocation, falls after a reset; malloc_trim present",
                  before_mib=before, during_mib=during, after_mib=after,
                  malloc_trim=trim)


def check_cuda_peaks(ctx: Context) -> Outcome:
    """The CUDA allocator's per-phase peaks (PhaseProbe on the tiny train step): positive,
    forward above what the step starts with, and a reset brings the peak down to what is held."""
    from lmperf.workload.probe import PhaseProbe

    device = ctx.device
    prepared = tiny_step(device)
    probe = PhaseProbe(dev.PeakMemory(device))
    prepared.step(prepared.state, probe)
    start = probe.start_mib["allocated"]
    peaks = {p: probe.phases[p]["allocated"] for p in PHASES}
    now = dev.memory_allocated(device) / MIB
    probe.memory.reset()
    after_reset = probe.memory.read()["allocated"]
    result = (f"allocated MiB at start {start:.1f}; peaks: "
              + ", ".join(f"{p} {v:.1f}" for p, v in peaks.items())
              + f"; after a reset {after_reset:.1f} (held {now:.1f})")
    good = (min(peaks.values()) > 0 and peaks["forward"] > start
            and abs(after_reset - now) < 1e-6)
    return passed(good, result, "forward's peak above the start; a reset's peak equals what "
                                "is held", start_mib=start, peaks_mib=peaks, held_mib=now)


def check_nvtx(ctx: Context) -> Outcome:
    """NVTX ranges (what Nsight Systems shows): lmperf's range opens and closes on this GPU."""
    import contextlib

    rng = dev.nvtx_range("lmperf doctor")
    if isinstance(rng, contextlib.nullcontext):
        return fail("nvtx_range fell back to a no-op", "torch.cuda.nvtx must work on CUDA")
    with rng:
        pass
    return ok("torch.cuda.nvtx range pushed and popped", "profile ranges appear in nsys")
