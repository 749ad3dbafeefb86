"""The doctor's measured-ceilings check: what it records, and that a bad ceiling fails it."""

from __future__ import annotations

import math
from pathlib import Path

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
