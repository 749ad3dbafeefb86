"""profile.roofline: labels read off the numbers, time attributed once to the op the counter saw,
and the roofline arithmetic; on synthetic rows and on a real V100 Kineto trace."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lmperf.runtime.ceilings import Ceilings
from lmperf.questions.profile import roofline as rl
from lmperf.questions.profile.trace import load_trace

V100 = Path(__file__).parent / "data" / "v100_ddp_sgd_5steps.json.gz"
CEIL = Ceilings("cpu", "test", 1, {"fp32": 1e9, "bf16": 1e8}, {"fp32": 128, "bf16": 128},
                copy_bytes_per_s=1e9, triad_bytes_per_s=2e9, stream_bytes=1 << 20)


def test_labels():
    assert rl.label(compute_ms=2.0, memory_ms=1.0, measured_ms=3.0) == "compute-bound"
    assert rl.label(compute_ms=1.0, memory_ms=2.0, measured_ms=3.0) == "memory-bound"
    assert rl.label(compute_ms=1.0, memory_ms=2.0, measured_ms=20.1) == "overhead-bound"
    assert rl.label(compute_ms=1.0, memory_ms=2.0, measured_ms=20.0) == "memory-bound"
    assert rl.label(0.0, 0.0, 0.5) == "overhead-bound"  # a view: no FLOPs, no bytes


def test_self_time_goes_to_the_outermost_op_the_counter_saw():
    # linear (not counted) > mm (counted); _to_copy (counted) > copy_ (counted, inside it)
    names = np.array(["aten::linear", "aten::mm", "aten::_to_copy", "aten::copy_"])
    starts, ends = np.array([0.0, 1.0, 10.0, 11.0]), np.array([5.0, 4.0, 20.0, 19.0])
    owners, points = rl._owners(names, starts, ends, {"aten::mm", "aten::_to_copy",
                                                      "aten::copy_"},
                                np.array([2.0, 4.5, 12.0, 30.0]))
    assert owners == ["aten::linear", "aten::mm", "aten::_to_copy", "aten::_to_copy"]
    # a kernel launched inside mm, inside linear only, inside copy_, and outside every op
    assert points == ["aten::mm", "aten::linear", "aten::_to_copy", ""]


def _costs() -> pd.DataFrame:
    return pd.DataFrame([
        # phase, op, dtype, op_class, calls, flops, bytes_read, bytes_written
        ("forward", "aten::mm", "fp32", "matmul", 1, 4e9, 1e6, 1e6),
        ("forward", "aten::mm", "bf16", "matmul", 1, 1e8, 0, 0),
        ("forward", "aten::mul", "fp32", "elementwise/norm", 2, 0, 3e6, 1e6),
        ("forward", "aten::view", "fp32", "elementwise/norm", 3, 0, 0, 0),
    ], columns=["phase", "op", "dtype", "op_class", "calls", "flops", "bytes_read",
                "bytes_written"])


def test_per_op_arithmetic():
    measured = pd.DataFrame({"phase": ["forward"] * 4,
                             "op": ["aten::mm", "aten::mul", "aten::view", "aten::linear"],
                             "measured_ms": [5000.0, 2.5, 0.1, 0.2], "calls": [2, 2, 3, 1]})
    df = rl.per_op_table(_costs(), measured, CEIL).set_index("op")
    mm = df.loc["aten::mm"]
    # fp32 rows at 1 GFLOP/s and bf16 rows at 0.1: 4000 ms + 1000 ms; 2 MB at 2 GB/s: 1 ms
    assert mm["compute_ms"] == pytest.approx(5000.0) and mm["memory_ms"] == pytest.approx(1.0)
    assert mm["ideal_ms"] == pytest.approx(5000.0) and mm["measured_over_ideal"] == pytest.approx(1)
    assert mm["bound"] == "compute-bound" and mm["dtype"] == "fp32/bf16"
    assert mm["attained_gflop_per_s"] == pytest.approx(4.1e9 / 5.0 / 1e9)
    mul = df.loc["aten::mul"]
    assert mul["memory_ms"] == pytest.approx(2.0) and mul["bound"] == "memory-bound"
    assert mul["intensity_flop_per_byte"] == 0
    assert df.loc["aten::view", "bound"] == "overhead-bound"
    assert df.loc["aten::linear", "op_class"] == "not counted"
    phases = rl.per_phase_table(df.reset_index(), {"forward": 6000.0}).set_index("phase")
    assert phases.loc["forward", "ideal_ms"] == pytest.approx(5002.0)
    assert phases.loc["forward", "above_ideal_ms"] == pytest.approx(998.0)
    assert phases.loc["step", "measured_ms"] == 6000.0
    top = rl.top_per_phase(df.reset_index(), 1)
    assert list(top["op"]) == ["aten::mm", "(3 other ops)"]
    assert top["measured_ms"].sum() == pytest.approx(df["measured_ms"].sum())


def test_kernels_are_attributed_once_on_a_real_cuda_trace():
    trace = load_trace(V100)
    counted = set(trace.ops["name"]) & {"aten::mm", "aten::addmm", "aten::convolution",
                                        "aten::copy_", "aten::add_"}
    df = rl.measured_per_op(trace, counted)
    k = trace.kernels
    launched = k[k["in_step"].astype(bool) & k["phase"].isin(rl.PHASES)]
    total_ms = df["measured_ms"].sum() * max(trace.n_steps, 1)
    # every in-step kernel's time lands on exactly one (phase, op), unless no op holds its launch
    assert 0 < total_ms <= launched["dur_us"].sum() / 1e3 + 1e-6
    assert not df.duplicated(["phase", "op"]).any()
