"""PhaseClock: wall and CPU time per phase, and where it synchronises (CUDA faked at the device
layer: the events and the synchronisations are recorded, not run)."""

from __future__ import annotations

import time

import pytest
import torch

from lmperf.runtime.device import clocks

CPU = torch.device("cpu")


def _spin(seconds: float) -> None:
    """Busy work on this thread until it has run `seconds` of CPU time (however loaded the
    machine is)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_a_phase_that_waits_costs_wall_time_but_no_cpu_time(one_thread):
    # a sleeping phase is what a descheduled thread looks like from inside: the wall clock runs,
    # this thread's CPU clock does not
    clock = clocks.PhaseClock(CPU)
    assert clock.cpu_kind == "thread_time"
    clock.start()
    time.sleep(0.03)
    clock.lap("waits")
    _spin(0.02)
    clock.lap("works")
    wall, cpu = clock.laps, clock.cpu_laps
    assert list(cpu) == ["waits", "works"]
    assert wall["waits"] >= 29.0 and cpu["waits"] < 10.0
    assert 20.0 <= cpu["works"] < 30.0 and wall["works"] >= cpu["works"] - 1.0
    assert clock.cpu_total_ms == pytest.approx(cpu["waits"] + cpu["works"], abs=1e-6)
    assert clock.total_ms == pytest.approx(wall["waits"] + wall["works"], abs=1e-6)


def test_several_torch_threads_use_the_process_cpu_clock():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert clocks.PhaseClock(CPU).cpu_kind == "process_time"
        torch.set_num_threads(1)
        assert clocks.PhaseClock(CPU).cpu_kind == "thread_time"
    finally:
        torch.set_num_threads(before)
    assert clocks.cpu_clock_kind(1) == "thread_time" and clocks.cpu_clock_kind(4) == "process_time"


def test_start_clears_the_cpu_laps_too():
    clock = clocks.PhaseClock(CPU, sync="step")
    clock.start()
    clock.lap("forward")
    clock.lap("backward")
    clock.start()
    clock.lap("forward")
    assert list(clock.laps) == list(clock.cpu_laps) == ["forward"]


def test_an_unknown_sync_mode_is_refused():
    with pytest.raises(ValueError, match="sync must be one of phase, step"):
        clocks.PhaseClock(CPU, sync="never")


class _FakeEvent:
    """A CUDA event on a fake GPU timeline: each record() advances the timeline by the next
    duration of `durations_ms` (ms since the previous event)."""

    timeline: list[str] = []
    durations_ms: list[float] = []
    now = 0.0

    def __init__(self, enable_timing: bool = False):
        assert enable_timing
        self.t = None

    def record(self, stream=None) -> None:
        _FakeEvent.now += _FakeEvent.durations_ms.pop(0) if _FakeEvent.durations_ms else 0.0
        self.t = _FakeEvent.now
        _FakeEvent.timeline.append("record")

    def synchronize(self) -> None:
        _FakeEvent.timeline.append("event sync")

    def elapsed_time(self, other: "_FakeEvent") -> float:
        return other.t - self.t


@pytest.fixture
def fake_cuda(monkeypatch):
    _FakeEvent.timeline, _FakeEvent.now = [], 0.0
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda index=None: None)
    monkeypatch.setattr(clocks, "cuda_index", lambda device: 0)
    monkeypatch.setattr(clocks, "synchronize",
                        lambda device: _FakeEvent.timeline.append("device sync"))
    return _FakeEvent


@pytest.mark.parametrize("sync, expected", [
    ("phase", ["device sync", "record", "record", "device sync", "record", "device sync",
               "event sync"]),
    ("step", ["device sync", "record", "record", "record", "event sync"]),
])
def test_where_a_cuda_step_synchronises(fake_cuda, sync, expected):
    fake_cuda.durations_ms = [0.0, 3.0, 5.0]
    clock = clocks.PhaseClock(torch.device("cuda", 0), sync=sync)
    assert clock.cpu_kind is None and clock.kind == "cuda_event"
    clock.start()
    clock.lap("forward")
    clock.lap("backward")
    assert clock.laps == {"forward": 3.0, "backward": 5.0}
    assert clock.total_ms == 8.0
    assert fake_cuda.timeline == expected  # reading twice waits once
    assert clock.cpu_laps == {} and clock.cpu_total_ms is None
