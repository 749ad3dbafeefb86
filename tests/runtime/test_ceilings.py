"""runtime.ceilings: the arithmetic of attained FLOP/s and bandwidth (on a fake clock), the
record round trip, and the datasheet peaks beside them."""

from __future__ import annotations

import math

import pytest
import torch

from lmperf.errors import SpecError
from lmperf.runtime import ceilings as ce
from lmperf.runtime import device as dev


class _FixedClock:
    """A PhaseClock whose every lap takes `ms` milliseconds."""

    ms = 2.0

    def __init__(self, device):
        self.laps: dict[str, float] = {}

    def start(self) -> None:
        pass

    def lap(self, phase: str) -> None:
        self.laps[phase] = self.ms


@pytest.fixture
def fixed_clock(monkeypatch):
    monkeypatch.setattr(dev, "PhaseClock", _FixedClock)
    return _FixedClock


def test_matmul_flops_is_2n3_over_the_best_call(fixed_clock):
    flops, n = ce.matmul_flops(torch.device("cpu"), torch.float32, repeats=2, min_call_s=1e-3,
                               max_n=256)
    # 2 ms per call >= the 1 ms minimum at n=128: no doubling
    assert n == 128
    assert flops == pytest.approx(2 * 128**3 / 2e-3)


def test_matmul_n_doubles_until_a_call_is_long_enough(fixed_clock):
    _, n = ce.matmul_flops(torch.device("cpu"), torch.float32, repeats=1, min_call_s=1.0,
                           max_n=512)
    assert n == 512  # 2 ms never reaches 1 s: doubled up to the cap


def test_bandwidth_counts_read_plus_written_bytes(fixed_clock):
    copy, triad, nbytes = ce.bandwidth(torch.device("cpu"), nbytes=4096, repeats=1)
    assert nbytes == 4096
    assert copy == pytest.approx(2 * 4096 / 2e-3)  # read x, write y
    assert triad == pytest.approx(3 * 4096 / 2e-3)  # read x and y, write z


def test_measure_ceilings_record_round_trip(monkeypatch, fixed_clock):
    monkeypatch.setattr(ce, "STREAM_BYTES", {"cpu": 4096})
    monkeypatch.setattr(ce, "MAX_N", {"cpu": 128})
    c = ce.measure_ceilings(torch.device("cpu"), ("fp32", "bf16"), repeats=1)
    assert set(c.matmul_flops_per_s) == {"fp32", "bf16"}
    assert c.threads == torch.get_num_threads()
    assert c.bandwidth_bytes_per_s == max(c.copy_bytes_per_s, c.triad_bytes_per_s)
    data = c.to_dict()
    assert data["bandwidth_bytes_per_s"] == c.bandwidth_bytes_per_s
    assert ce.Ceilings.from_dict(data) == c
    assert c.flops_per_s("fp16") is None


def test_a_real_measurement_is_positive_and_finite():
    flops, n = ce.matmul_flops(torch.device("cpu"), torch.float32, repeats=1, max_n=128)
    copy, triad, _ = ce.bandwidth(torch.device("cpu"), nbytes=2**20, repeats=1)
    assert n == 128 and all(math.isfinite(v) and v > 0 for v in (flops, copy, triad))


def test_a_fresh_output_costs_its_extra_over_a_copy_into_an_existing_one(monkeypatch):
    """fresh_write: bytes over (the clone's best time - the copy's); None where the clone is no
    slower (an allocator that keeps its pages)."""
    best = {"clone": 5e-3, "copy_": 1e-3}
    monkeypatch.setattr(ce, "_best_s", lambda fn, device, repeats: best[fn.__code__.co_names[-1]])
    assert ce.fresh_write(torch.device("cpu"), nbytes=4096) == pytest.approx(4096 / 4e-3)
    best["clone"] = 1e-3
    assert ce.fresh_write(torch.device("cpu"), nbytes=4096) is None


def test_a_real_fresh_write_rate_is_none_or_positive_and_finite():
    rate = ce.fresh_write(torch.device("cpu"), nbytes=2**26, repeats=2)
    assert rate is None or (math.isfinite(rate) and rate > 0)


def test_unknown_dtype_is_a_spec_error():
    with pytest.raises(SpecError, match="fp8"):
        ce.measure_ceilings(torch.device("cpu"), ("fp8",))


def test_datasheet_peaks_never_borrow():
    a100 = ce.datasheet_peaks("NVIDIA A100-SXM4-80GB")
    assert a100["bf16"] == pytest.approx(312e12) and a100["fp32"] == pytest.approx(19.5e12)
    assert ce.datasheet_peaks("AMD EPYC") == {}
    assert ce.datasheet_peaks("NVIDIA A100-SXM4-40GB MIG 1g.5gb") == {}


class _Device:
    """A simulated device for the matmul probe: a call takes 2 n^3 / PEAK seconds, plus INIT_S
    for the very first call (a library handle, a kernel loaded): what the H200's cuBLAS did."""

    PEAK, INIT_S = 1e10, 0.5

    def __init__(self):
        self.n, self.calls = 0, 0

    def mm(self, a, b):
        self.n, self.calls = a.shape[0], self.calls + 1
        return a

    def clock(self, device):
        sim = self

        class Clock(_FixedClock):
            def lap(self, phase):
                self.laps[phase] = 1e3 * (2 * sim.n**3 / sim.PEAK
                                          + (sim.INIT_S if sim.calls == 1 else 0.0))
        return Clock(device)


@pytest.fixture
def simulated(monkeypatch):
    sim = _Device()
    monkeypatch.setattr(torch, "mm", sim.mm)
    monkeypatch.setattr(dev, "PhaseClock", sim.clock)
    return sim


def test_a_slow_first_call_does_not_stop_the_probe_at_128(simulated):
    # issue 34: the first call (the warm-up) took >= MIN_CALL_S, so the probe stopped at n = 128
    # and reported 0.1% of the device's rate; each size is now warmed up before it is judged.
    flops, n = ce.matmul_flops(torch.device("cpu"), torch.float32, max_n=2048)
    assert n == 512  # the first n whose call (2 n^3 / 1e10 s) reaches 20 ms
    assert flops == pytest.approx(_Device.PEAK)


def test_the_probe_starts_at_the_devices_min_n(simulated, monkeypatch):
    # on CUDA no product below 4096 is judged: smaller ones cannot reach a GPU's peak
    assert ce.MIN_N["cuda"] >= 4096 and ce.MAX_N["cuda"] >= ce.MIN_N["cuda"]
    monkeypatch.setitem(ce.MIN_N, "cpu", 1024)
    simulated.INIT_S = 10.0  # every call judged long enough: the probe stays where it starts
    _, n = ce.matmul_flops(torch.device("cpu"), torch.float32, max_n=4096)
    assert n == 1024


def test_a_size_that_runs_out_of_memory_is_halved(simulated, monkeypatch):
    monkeypatch.setitem(ce.MIN_N, "cpu", 1024)
    real_randn = torch.randn

    def randn(*shape, **kw):
        if shape[0] > 256:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")
        return real_randn(*shape, **kw)

    monkeypatch.setattr(torch, "randn", randn)
    flops, n = ce.matmul_flops(torch.device("cpu"), torch.float32, max_n=4096)
    assert n == 256 and flops > 0  # 1024 and 512 did not fit, and 256 is not doubled again


def test_bandwidth_buffers_stay_a_sixteenth_of_the_devices_memory(fixed_clock, monkeypatch):
    monkeypatch.setattr(dev, "device_memory_gib", lambda device: 16 * 4096 / 2**30)
    _, _, nbytes = ce.bandwidth(torch.device("cpu"), nbytes=2**20, repeats=1)
    assert nbytes == 4096
