"""Phase clocks: CUDA events on a GPU, the host clock on the CPU; every phase ends with a device
synchronisation."""

from __future__ import annotations

import timeit

import torch

from lmperf.runtime.device.select import cuda_index, synchronize


class PhaseClock:
    """Times consecutive phases of one step; every phase is closed by a device synchronisation.

    On CUDA the durations come from CUDA events recorded at the phase boundaries (GPU time, which
    includes launch gaps); on the CPU from `timeit.default_timer` (perf_counter) after the sync.
    Usage: `clock.start()`, then `clock.lap("forward")`, `clock.lap("backward")`, ...;
    `clock.laps` maps phase name -> milliseconds, and `clock.total_ms` is the whole step.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.kind = "cuda_event" if self.cuda else "perf_counter"
        self.laps: dict[str, float] = {}
        self.total_ms = 0.0
        self._marks: list = []

    def _mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(cuda_index(self.device)))  # the run's device
            synchronize(self.device)
            return ev
        return timeit.default_timer()

    @staticmethod
    def _ms(a, b) -> float:
        if isinstance(a, float):
            return (b - a) * 1e3
        return a.elapsed_time(b)  # CUDA events: already milliseconds

    def start(self) -> None:
        """Begin a step: drain the device, then take the first mark."""
        synchronize(self.device)
        self.laps = {}
        self._marks = [self._mark()]

    def lap(self, phase: str) -> None:
        """Close `phase`: synchronise and record its duration since the previous mark."""
        self._marks.append(self._mark())
        self.laps[phase] = self._ms(self._marks[-2], self._marks[-1])
        self.total_ms = self._ms(self._marks[0], self._marks[-1])
