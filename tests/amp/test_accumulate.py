"""`lmperf amp accumulate`: sums and stalls against numpy loops and a struct-based bf16 rounding."""

from __future__ import annotations

import argparse
import json
import struct

import numpy as np
import pytest
import torch

from lmperf.questions.amp import accumulate

CPU = torch.device("cpu")


def bf16(x: float) -> float:
    """x (a Python float) rounded to bfloat16, nearest even: keep 7 of float64's 52 fraction bits.

    Valid for normal bf16 magnitudes, which is all this file needs.
    """
    (u,) = struct.unpack("<Q", struct.pack("<d", x))
    u = (u + (1 << 44) - 1 + ((u >> 45) & 1)) & ~((1 << 45) - 1)
    return struct.unpack("<d", struct.pack("<Q", u))[0]


def np_loop(dtype: type, n: int, addend: float) -> list[float]:
    s, x = dtype(0), dtype(addend)
    out = [float(s)]
    for _ in range(n):
        s = dtype(s + x)
        out.append(float(s))
    return out


@pytest.fixture(scope="module")
def result():
    return accumulate.run(CPU)


def _row(result, case: str, n: int):
    df = result.table("accumulation")
    rows = df[(df["case"] == case) & (df["n"] == n)]
    assert len(rows) == 1
    return rows.iloc[0]


def test_fp16_sum_matches_numpy_half_loop(result):
    row = _row(result, "fp16 += fp16", 1000)
    assert row["result"] == np_loop(np.float16, 1000, 0.01)[-1] == 9.953125
    assert row["abs_error"] == 0.046875 and row["stall_value"] is None


def test_fp32_sums_match_numpy_float32_loops(result):
    assert _row(result, "fp32 += fp32", 1000)["result"] == np_loop(np.float32, 1000, 0.01)[-1]
    assert _row(result, "fp32 += fp32", 10000)["result"] == np_loop(np.float32, 10000, 0.001)[-1]


def test_fp32_accumulator_with_fp16_addend(result):
    x = float(np.float16(0.01))
    s = np.float32(0)
    for _ in range(1000):
        s = np.float32(s + np.float32(x))
    for case in ("fp32 += fp16 (promoted)", "fp32 += fp16.to(fp32)"):
        assert _row(result, case, 1000)["result"] == float(s)


def test_bf16_stall_matches_exact_reasoning(result):
    x = bf16(0.01)
    s, step = 0.0, 0
    while True:  # the sum of two bf16 values is exact in float64, so only bf16() rounds
        step += 1
        nxt = bf16(s + x)
        if nxt == s:
            break
        s = nxt
    row = _row(result, "bf16 += bf16", 1000)
    assert (row["stall_value"], row["stall_step"]) == (s, step)
    # by hand: in [4, 8) bf16's ulp is 2**-5, and 0.01 < 2**-6, so 4.0 + x rounds back to 4.0
    assert s == 4.0 and row["ulp_at_stall"] == 2.0 ** -5 and row["result"] == 4.0
    assert row["addend_over_ulp_at_stall"] == x / 2.0 ** -5 < 0.5


def test_long_fp16_stall_matches_numpy(result):
    hist = np_loop(np.float16, 10000, 0.001)
    stall = next(i for i in range(1, len(hist)) if hist[i] == hist[i - 1])
    row = _row(result, "fp16 += fp16", 10000)
    assert (row["stall_step"], row["stall_value"], row["result"]) == (stall, hist[stall - 1], hist[-1])


def test_first_stall():
    assert accumulate.first_stall([0.0, 1.0, 2.0]) is None
    assert accumulate.first_stall([0.0, 1.0, 1.0, 1.0]) == 2


def test_arguments_defaults_and_tables():
    parser = argparse.ArgumentParser()
    accumulate.add_arguments(parser)
    args = vars(parser.parse_args([]))
    assert args == {"n": 1000, "addend": 0.01, "long_n": 10000, "long_addend": 0.001}
    assert parser.parse_args(["--long-n", "5"]).long_n == 5
    res = accumulate.run(CPU, n=50, addend=0.5, long_n=20, long_addend=0.25)
    assert [t for t, _ in res.tables] == ["accumulation"]
    acc = res.table("accumulation")
    assert len(acc) == 2 * len(accumulate.CASES) and set(acc["n"]) == {50, 20}
    assert res.notes and json.dumps(res.to_dict(), allow_nan=False)


def test_defaults_run_has_both_runs(result):
    acc = result.table("accumulation")
    assert sorted(set(acc["n"])) == [1000, 10000]
    assert any("9.953125" in n for n in result.notes)


@pytest.mark.parametrize("options, flag", [
    ({"n": 0}, "--n"), ({"long_n": 10**9}, "--long-n"),
    ({"addend": float("nan")}, "--addend"), ({"long_addend": 0.0}, "--long-addend"),
])
def test_bad_options_raise_value_error(options, flag):
    with pytest.raises(ValueError, match=flag):
        accumulate.run(CPU, **options)
