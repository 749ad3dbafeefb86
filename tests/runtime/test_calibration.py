"""runtime.calibration and runtime.host_costs: interpolation of size-aware ceilings from
injected measurements, the arithmetic of a calibration (on a fake clock), and the record round
trip."""

from __future__ import annotations

import math

import pytest
import torch

from lmperf.runtime import calibration as ca
from lmperf.runtime import host_costs
from lmperf.runtime import device as dev

DIMS = (16, 64, 256, 1024)


def _grid(rate) -> list[list[float]]:
    return [[m, k, n, rate(m, k, n)] for m in DIMS for k in DIMS for n in DIMS]


def _calibration(rate=lambda m, k, n: 1e9 * min(m, k, n) ** 0.5) -> ca.Calibration:
    return ca.Calibration(
        threads=1, matmul=_grid(rate),
        bandwidth=[[2**18, 80e9], [2**20, 40e9], [2**26, 10e9]],
        element_rates={"exp": [[2**21, 1e9], [2**25, 5e8]],
                       "softmax": [[2**21, 8e8], [2**25, 4e8]]},
        optimizer_bytes_per_s=20e9, fresh_output_s_per_byte=1e-9, give_back_s_per_byte=2e-10,
        optimizer_fixed_s=1e-4,
        optimizer_tensor_s=1e-5, seconds=0.5)


def test_a_narrow_matmul_gets_a_lower_ceiling_than_a_square_one():
    cal = _calibration()
    square = cal.matmul_flops_per_s(1024, 1024, 1024)
    assert square == pytest.approx(32e9)  # a grid point: its own measurement
    for narrow in ((1024, 64, 1024), (64, 1024, 1024), (1024, 1024, 64), (512, 64, 10000)):
        assert cal.matmul_flops_per_s(*narrow) == pytest.approx(8e9)
    assert cal.matmul_flops_per_s(128, 128, 128) < square


def test_interpolation_is_linear_in_log2_of_each_dimension_and_clamped():
    cal = _calibration(lambda m, k, n: 1e9 * m)  # only m matters
    # 128 is halfway between 64 and 256 in log2: the geometric mean of their rates
    assert cal.matmul_flops_per_s(128, 100, 3000) == pytest.approx(math.sqrt(64 * 256) * 1e9)
    assert cal.matmul_flops_per_s(8, 64, 64) == pytest.approx(16e9)  # below the grid: 16's
    assert cal.matmul_flops_per_s(10_000, 64, 64) == pytest.approx(1024e9)  # above: 1024's


def test_bandwidth_and_element_rates_follow_the_working_set():
    cal = _calibration()
    assert cal.bandwidth_bytes_per_s(2**19) == pytest.approx(math.sqrt(80e9 * 40e9))
    assert cal.bandwidth_bytes_per_s(1) == pytest.approx(80e9)  # clamped to the range
    assert cal.bandwidth_bytes_per_s(2**30) == pytest.approx(10e9)
    assert cal.element_rate("aten::exp", 2**21) == pytest.approx(1e9)
    assert cal.element_rate("aten::silu_backward", 2**23) == pytest.approx(math.sqrt(5e17))
    assert cal.element_rate("aten::_log_softmax", 2**30) == pytest.approx(4e8)
    assert cal.element_rate("aten::mul", 2**21) is None  # no transcendental: bandwidth's
    assert cal.element_rate("aten::_log_softmax_backward_data", 2**21) is None  # not measured


def test_faulted_bytes_and_the_optimizers_host_time_at_their_measured_rates():
    cal = _calibration()
    assert cal.fault_s(64 * 2**20) == pytest.approx(64 * 2**20 * 1e-9)
    assert cal.give_back_s(2**20) == pytest.approx(2**20 * 2e-10)
    assert cal.optimizer_host_s(30) == pytest.approx(1e-4 + 30 * 1e-5)
    assert ca.Calibration(threads=1).optimizer_host_s(30) is None  # not measured


def test_record_round_trip():
    cal = _calibration()
    assert ca.Calibration.from_dict(cal.to_dict() | {"extra": 1}) == cal


class _CpuClock:
    """A PhaseClock whose every lap takes `ms` of CPU time (and 10x that of wall time)."""

    ms = 0.5
    cpu_kind = "thread_time"

    def __init__(self, device):
        self.laps: dict[str, float] = {}
        self.cpu_laps: dict[str, float] = {}

    def start(self) -> None:
        pass

    def lap(self, phase: str) -> None:
        self.cpu_laps[phase], self.laps[phase] = self.ms, 10 * self.ms


@pytest.fixture
def cpu_clock(monkeypatch):
    monkeypatch.setattr(dev, "PhaseClock", _CpuClock)
    return _CpuClock


def test_rates_are_work_over_cpu_time_of_repeated_calls(cpu_clock):
    # 0.5 ms per timing, below MIN_TIMING_S: the timed function is called twice per timing,
    # and each timing (the clock's lap) still reads 0.5 ms
    calls = []
    rate = ca._timed_rate(lambda: calls.append(1), work=10.0, repeats=3)
    assert rate == pytest.approx(10.0 * 2 / 0.5e-3)
    assert len(calls) == 1 + 3 * 2  # the single (warm-up) call, then 3 timings of 2 calls
    # a (4, 4) @ (4, 4) product: batched up to CACHE_BYTES of operands
    batch = ca.CACHE_BYTES // (4 * 3 * 16)
    assert ca.matmul_rate(4, 4, 4, repeats=1) == pytest.approx(2 * batch * 64 * 2 / 0.5e-3)
    assert ca.triad_bandwidth(1200, repeats=1) == pytest.approx(1200 * 2 / 0.5e-3)


def test_calibrate_measures_every_point(cpu_clock, monkeypatch):
    monkeypatch.setattr(ca, "RATE_SHAPES", ((4, 8), (16, 8)))
    monkeypatch.setattr(ca, "optimizer_bandwidth", lambda repeats: 7.0)  # its own test below
    monkeypatch.setattr(ca, "FRESH_PROBE_BYTES", 4096)
    monkeypatch.setattr(ca, "POOL_BYTES", 2**16)
    monkeypatch.setattr(ca, "optimizer_host_cost", lambda repeats: (1e-4, 2e-6))
    monkeypatch.setattr(ca, "host_op_costs", lambda: (9e-6, 5e-6))
    cal = ca.calibrate(repeats=1, dims=(4, 8), working_sets=(1024, 4096))
    assert len(cal.matmul) == 8 and [ws for ws, _ in cal.bandwidth] == [1024, 4096]
    assert cal.element_rates["exp"] == [[8 * 32, 32 * 2 / 0.5e-3], [8 * 128, 128 * 2 / 0.5e-3]]
    assert [ws for ws, _ in cal.element_rates["softmax_backward"]] == [12 * 32, 12 * 128]
    assert cal.optimizer_bytes_per_s == 7.0
    assert cal.fresh_output_s_per_byte == 0.0  # fresh and reused fills: the same 0.5 ms
    assert cal.give_back_s_per_byte == pytest.approx(0.5e-3 / 4096)  # the free: one lap
    assert (cal.optimizer_fixed_s, cal.optimizer_tensor_s) == (1e-4, 2e-6)
    assert (cal.op_host_s("forward"), cal.op_host_s("backward")) == (9e-6, 5e-6)
    assert cal.op_host_s("optimizer") is None and ca.Calibration(1).op_host_s("forward") is None
    assert cal.threads == torch.get_num_threads() and cal.seconds > 0


@pytest.mark.slow  # the first AdamW of a process imports torch's compiler stack (seconds)
def test_the_optimizer_bandwidth_counts_28_bytes_per_element(cpu_clock):
    assert ca.optimizer_bandwidth(64, repeats=1) == pytest.approx(28 * 64 * 2 / 0.5e-3)


def test_a_real_calibration_point_is_positive_and_finite():
    rate = ca.matmul_rate(16, 16, 16, repeats=1)
    assert math.isfinite(rate) and rate > 0


def test_cold_operands_come_from_the_next_slice_of_the_pool_at_every_call(cpu_clock):
    pool = ca.ColdPool(4096)
    slices = pool.slices(1000)  # 250 fp32 elements each: 4 disjoint slices of the pool
    assert len(slices) == 4 and {s.numel() for s in slices} == {250}
    starts = [s.data_ptr() - pool.buffer.data_ptr() for s in slices]
    assert starts == [0, 1000, 2000, 3000]
    assert pool.slices(8192)[0].numel() == 2048  # larger than the pool: fresh memory
    # the timed calls cycle through the list and never restart at its first element
    seen = []
    ca._timed_rate([lambda i=i: seen.append(i) for i in range(3)], work=1.0, repeats=2)
    assert seen == [0, 1, 2, 0, 1]  # a warm-up call, then 2 timings of 2 calls (fake clock)


def test_a_matmul_rate_with_a_pool_takes_each_call_from_the_next_slice(cpu_clock, monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "bmm", lambda a, b, out: calls.append(a.data_ptr()))
    batch = ca.CACHE_BYTES // (4 * 3 * 16)  # (4, 4) @ (4, 4) products: a, b and out per slice
    pool = ca.ColdPool(2 * 4 * 3 * 16 * batch)  # two slices
    ca.matmul_rate(4, 4, 4, repeats=1, pool=pool)
    base = pool.buffer.data_ptr()
    # a warm-up call, then one timing of two calls (0.5 ms each on the fake clock)
    assert [c - base for c in calls] == [0, 4 * 3 * 16 * batch, 0]


def test_the_optimizer_host_cost_is_a_fixed_time_plus_a_time_per_tensor(monkeypatch):
    # scripted CPU times of each lap: the first of each count (AdamW's state) is dropped
    laps = iter([1.0, 1e-3 + 8 * 1e-5, 1.0, 1e-3 + 64 * 1e-5])

    def fake_best(fn, repeats):
        fn()
        return next(laps)

    monkeypatch.setattr(host_costs, "best_cpu_s", fake_best)
    fixed, per_tensor = ca.optimizer_host_cost((8, 64), repeats=1)
    assert fixed == pytest.approx(1e-3) and per_tensor == pytest.approx(1e-5)


def test_the_host_time_per_call_is_a_phase_time_over_its_counted_aten_calls(cpu_clock):
    forward, backward = ca.host_op_costs(repeats=2)
    # every phase takes 0.5 ms on the fake clock: the per-call figures are 0.5 ms / calls
    forward_calls, backward_calls = 0.5e-3 / forward, 0.5e-3 / backward
    assert forward_calls == pytest.approx(round(forward_calls))
    # each of the 8 blocks: norm, 2 linears (each t + addmm, views around a 3-D input), gelu, add
    assert 8 * 5 < forward_calls < backward_calls
