"""Phase clocks: wall time from CUDA events on a GPU or the host clock on the CPU, plus CPU time on
the CPU; a device synchronisation at every phase boundary, or only once per step."""

from __future__ import annotations

import time
import timeit
from typing import Callable

import torch

from lmperf.runtime.device.select import cuda_index, synchronize

SYNC_MODES: tuple[str, ...] = ("phase", "step")
# The CPU clocks a PhaseClock can read (seconds of CPU time): the measuring thread's, or the sum
# over every thread of the process.
CPU_CLOCKS: dict[str, Callable[[], float]] = {
    "thread_time": time.thread_time,
    "process_time": time.process_time,
}
CPU_CLOCK_COVERS: dict[str, str] = {
    "thread_time": "the measuring thread (torch ran one intra-op thread: the whole step)",
    "process_time": "all threads of the process, summed (torch ran several intra-op threads)",
}


def cpu_clock_kind(threads: int | None = None) -> str:
    """The CPU clock that covers a step's work: 'thread_time' when torch runs one intra-op thread
    (every op runs on the calling thread), else 'process_time' (the pool's threads do the work;
    their CPU time is only visible summed over the process). `threads`: torch's intra-op thread
    count (default: `torch.get_num_threads()` now)."""
    n = torch.get_num_threads() if threads is None else threads
    return "thread_time" if n == 1 else "process_time"


def _summed(laps) -> dict[str, float]:
    out: dict[str, float] = {}
    for phase, ms in laps:
        out[phase] = out.get(phase, 0.0) + ms
    return out


class PhaseClock:
    """Times consecutive phases of one step: wall time, and on the CPU also CPU time.

    Usage: `clock.start()`, then `clock.lap("forward")`, `clock.lap("backward")`, ...; `laps`
    maps phase name -> wall milliseconds and `total_ms` is the whole step (start to last lap);
    `cpu_laps` and `cpu_total_ms` are the same in CPU milliseconds ({} and None on CUDA).

    Wall time: on CUDA from CUDA events recorded at the boundaries (GPU time, launch gaps
    included); on the CPU from `timeit.default_timer` (perf_counter).

    sync: 'phase' (the default) closes every phase with a device synchronisation, so that each
    phase is drained before the next one is queued (what profile and the doctor time). 'step'
    synchronises at `start()` and once more when the step's times are first read, as a training
    loop does: on CUDA the host keeps queueing the next phase's kernels while the GPU works, the
    events still mark the phases on the GPU's timeline, and `total_ms` is the unsynchronised
    step time (bench and train use it). On the CPU ops run synchronously: both modes time the
    same thing.

    CPU time (`cpu_kind`, see `cpu_clock_kind`; summed over threads it can exceed wall time):
    another process steals wall time from a step but not its CPU time (docs/commands/compare.md).
    """

    def __init__(self, device: torch.device, sync: str = "phase"):
        if sync not in SYNC_MODES:
            raise ValueError(f"sync must be one of {', '.join(SYNC_MODES)}, got {sync!r}")
        self.device = device
        self.sync = sync
        self.cuda = device.type == "cuda"
        self.kind = "cuda_event" if self.cuda else "perf_counter"
        self.cpu_kind: str | None = None if self.cuda else cpu_clock_kind()
        self._cpu_clock = None if self.cpu_kind is None else CPU_CLOCKS[self.cpu_kind]
        self._names: list[str] = []
        self._marks: list = []  # perf_counter seconds, or CUDA events
        self._cpu_marks: list[float] = []  # CPU seconds at the same boundaries
        self._wall_ms: list[float] | None = None  # resolved lap durations (None: not yet read)

    def _mark(self, sync: bool):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(cuda_index(self.device)))  # the run's device
            if sync:
                synchronize(self.device)
            return ev
        return timeit.default_timer()

    def start(self) -> None:
        """Begin a step: drain the device, then take the first mark."""
        synchronize(self.device)
        self._names, self._wall_ms = [], None
        self._marks = [self._mark(sync=False)]
        if self._cpu_clock is not None:
            self._cpu_marks = [self._cpu_clock()]

    def lap(self, phase: str) -> None:
        """Close `phase` (synchronising first when `sync` is 'phase'); read its duration from
        `laps` and `cpu_laps`."""
        self._marks.append(self._mark(sync=self.sync == "phase"))
        if self._cpu_clock is not None:
            self._cpu_marks.append(self._cpu_clock())
        self._names.append(phase)
        self._wall_ms = None

    def _resolve(self) -> list[float]:
        """The wall milliseconds of each lap, then of the whole step (computed once per step)."""
        if self._wall_ms is None:
            marks = self._marks
            if len(marks) < 2:
                return [0.0]
            if self.cuda:
                # sync='step': this is the step's one wait, at its end (a no-op with sync='phase',
                # whose last lap already synchronised). elapsed_time needs both events complete.
                marks[-1].synchronize()
                pairs = list(zip(marks, marks[1:])) + [(marks[0], marks[-1])]
                self._wall_ms = [a.elapsed_time(b) for a, b in pairs]  # already milliseconds
            else:
                pairs = list(zip(marks, marks[1:])) + [(marks[0], marks[-1])]
                self._wall_ms = [(b - a) * 1e3 for a, b in pairs]
        return self._wall_ms

    @property
    def laps(self) -> dict[str, float]:
        """Phase name -> wall milliseconds of the current step (reading waits for the device);
        a phase that recurs in a step (one per micro-batch of gradient accumulation) summed."""
        return _summed(zip(self._names, self._resolve()[:-1]))

    @property
    def total_ms(self) -> float:
        """Wall milliseconds from `start()` to the last lap (0 before any lap)."""
        return self._resolve()[-1]

    @property
    def cpu_laps(self) -> dict[str, float]:
        """Phase name -> CPU milliseconds (`cpu_kind`) of the current step; {} on CUDA."""
        m = self._cpu_marks
        return _summed((p, (b - a) * 1e3) for p, a, b in zip(self._names, m, m[1:]))

    @property
    def cpu_total_ms(self) -> float | None:
        """CPU milliseconds from `start()` to the last lap; None on CUDA."""
        if self._cpu_clock is None:
            return None
        return (self._cpu_marks[-1] - self._cpu_marks[0]) * 1e3 if self._cpu_marks else 0.0
