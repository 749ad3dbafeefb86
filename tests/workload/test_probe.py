"""The per-phase probe under gradient accumulation: a phase that repeats within a step (one
forward and one backward per micro-batch) reports its largest peak, not its last one; a new step
starts afresh."""

from __future__ import annotations

import torch

from lmperf.workload.probe import PhaseProbe


class _Readings:
    """A PeakMemory stand-in whose reads return the given RSS figures in turn (MiB)."""

    device, cuda, kind = torch.device("cpu"), False, "cpu_process_peak_rss"

    def __init__(self, values: list[float]):
        self.values = iter(values)

    def reset(self) -> None:
        pass

    def read(self) -> dict:
        return {"rss": next(self.values)}


def test_a_phase_repeated_within_a_step_keeps_its_largest_peak():
    # start, then per lap: the phase's peak and what is held after it
    probe = PhaseProbe(_Readings([100, 300, 150, 200, 150, 250, 120, 180, 110, 100]))
    probe.start()
    for phase in ("forward", "backward", "forward", "backward"):  # two micro-batches
        probe.lap(phase)
    assert probe.phases == {"forward": {"rss": 300}, "backward": {"rss": 200}}  # last: 250, 180
    probe.start()  # the next step: its own peaks only
    assert probe.phases == {} and probe.held == {}
