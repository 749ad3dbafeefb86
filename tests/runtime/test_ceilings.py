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


def test_unknown_dtype_is_a_spec_error():
    with pytest.raises(SpecError, match="fp8"):
        ce.measure_ceilings(torch.device("cpu"), ("fp8",))


def test_datasheet_peaks_never_borrow():
    a100 = ce.datasheet_peaks("NVIDIA A100-SXM4-80GB")
    assert a100["bf16"] == pytest.approx(312e12) and a100["fp32"] == pytest.approx(19.5e12)
    assert ce.datasheet_peaks("AMD EPYC") == {}
    assert ce.datasheet_peaks("NVIDIA A100-SXM4-40GB MIG 1g.5gb") == {}
