"""The doctor's measured-ceilings check: what it records, and that a bad ceiling fails it: not
finite, or (where the datasheet knows the device) below 30% of its matmul peak or 50% of its
bandwidth, as the H200's first run measured (issue 34), or above 100% of the peak (a wrong entry)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from lmperf.runtime import ceilings as ce
from lmperf.questions.doctor import ceilings as check
from lmperf.questions.doctor.checks import Context


def _fake(flops: float):
    def measure(device, dtypes, repeats=3):
        return ce.Ceilings("cpu", "AMD EPYC", 1, {d: flops for d in dtypes},
                           {d: 512 for d in dtypes}, 8e9, 1e10, 1 << 26, 2e-6)
    return measure


def test_records_the_ceilings_and_says_the_thread_count(monkeypatch, tmp_path: Path):
    monkeypatch.setattr(ce, "measure_ceilings", _fake(5e10))
    out = check.check_ceilings(Context(torch.device("cpu"), tmp_path))
    assert out.status == "ok"
    assert "fp32 50.0 GFLOP/s" in out.result and "bf16 50.0 GFLOP/s" in out.result
    assert "bandwidth 10.0 GB/s" in out.result and "1 thread(s)" in out.result
    assert "2.0 us per eager op call" in out.result
    # the CPU's checks run three at a time: the row says its figures were measured so (issue 28)
    assert out.result.startswith("beside up to 2 other checks: matmul fp32")
    assert out.values["ceilings"]["bandwidth_bytes_per_s"] == 1e10
    assert out.values["peaks"] == {}  # a CPU has no datasheet entry


def test_a_non_finite_ceiling_fails(monkeypatch, tmp_path: Path):
    monkeypatch.setattr(ce, "measure_ceilings", _fake(math.inf))
    assert check.check_ceilings(Context(torch.device("cpu"), tmp_path)).status == "fail"


# The H200's row of `lmperf doctor --device cuda` at e10cc18 (../shared/gpu/runs/2026-11-27-h200/
# warm-up-off/doctor.jsonl): every matmul timed at n = 128, and the row said ok.
H200_ROW = {"device": "cuda", "device_name": "NVIDIA H200", "threads": 1,
            "matmul_flops_per_s": {"fp32": 163431422461.3529, "bf16": 172690378249.7262,
                                   "fp16": 155298573821.67407},
            "matmul_n": {"fp32": 128, "bf16": 128, "fp16": 128},
            "copy_bytes_per_s": 4189590841218.8535, "triad_bytes_per_s": 4335944897959.7593,
            "stream_bytes": 1073741824, "op_overhead_s": 7.3213758468627934e-06}


def _measured(**changes):
    def measure(device, dtypes, repeats=3):
        return ce.Ceilings.from_dict({**H200_ROW, **changes})
    return measure


def test_the_h200s_128_x_128_ceilings_fail_with_their_share_of_the_peak(monkeypatch, tmp_path):
    monkeypatch.setattr(ce, "measure_ceilings", _measured())
    out = check.check_ceilings(Context(torch.device("cuda"), tmp_path))
    assert out.status == "fail"
    assert out.result.startswith("outside the bounds: fp32 0.2% of its peak (n = 128); bf16 0.0% of "
                                 "its peak (n = 128); fp16 0.0% of its peak (n = 128); matmul")
    assert out.values["shares"]["fp32"] == pytest.approx(163.4e9 / 66.9e12, rel=1e-3)


def test_ceilings_at_the_peak_pass_and_a_slow_bandwidth_fails(monkeypatch, tmp_path):
    # fp32 at 8192 and bf16 at 8192 as the H200's profile measured them (51 and 753 TFLOP/s)
    peak = {"matmul_flops_per_s": {"fp32": 51e12, "bf16": 753e12, "fp16": 760e12},
            "matmul_n": {"fp32": 8192, "bf16": 8192, "fp16": 8192}}
    monkeypatch.setattr(ce, "measure_ceilings", _measured(**peak))
    out = check.check_ceilings(Context(torch.device("cuda"), tmp_path))
    assert out.status == "ok", out
    assert "bandwidth 4335.9 GB/s (copy 4189.6, triad 4335.9), 90% of peak" in out.result
    monkeypatch.setattr(ce, "measure_ceilings", _measured(**peak, copy_bytes_per_s=2.0e12,
                                                          triad_bytes_per_s=2.2e12))
    out = check.check_ceilings(Context(torch.device("cuda"), tmp_path))
    assert out.status == "fail" and "bandwidth 45.8% of the datasheet's" in out.result


def test_a_matmul_above_its_peak_fails(monkeypatch, tmp_path):
    # bf16 at 1200 TFLOP/s: above the H200's dense bf16 entry (989), so the entry is wrong
    peak = {"matmul_flops_per_s": {"fp32": 51e12, "bf16": 1200e12, "fp16": 760e12},
            "matmul_n": {"fp32": 8192, "bf16": 8192, "fp16": 8192}}
    monkeypatch.setattr(ce, "measure_ceilings", _measured(**peak))
    out = check.check_ceilings(Context(torch.device("cuda"), tmp_path))
    assert out.status == "fail" and out.result.startswith("outside the bounds: bf16 121.3% of its")
