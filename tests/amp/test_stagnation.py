"""`lmperf amp stagnation`: counts of moving updates against numpy loops and hand-derived spacings."""

from __future__ import annotations

import argparse
import json
import struct

import numpy as np
import pytest
import torch

from lmperf.questions.amp import stagnation

CPU = torch.device("cpu")


def bf16(x: float) -> float:
    """x (a Python float) rounded to bfloat16, nearest even: keep 7 of float64's 52 fraction bits."""
    (u,) = struct.unpack("<Q", struct.pack("<d", x))
    u = (u + (1 << 44) - 1 + ((u >> 45) & 1)) & ~((1 << 45) - 1)
    return struct.unpack("<d", struct.pack("<Q", u))[0]


def count_changes(values: list[float]) -> int:
    return sum(a != b for a, b in zip(values, values[1:]))


@pytest.fixture(scope="module")
def table():
    return stagnation.run(CPU).table("w <- w - delta, 1000 steps").set_index("regime")


def test_bf16_never_moves_at_one(table):
    # by hand: the bf16 value below 1.0 is 1 - 2**-8 (7 fraction bits, one binade down), so
    # 1 - delta rounds back to 1 unless delta > 2**-9 ~ 0.00195; bf16(1e-4) is far below that
    d = bf16(1e-4)
    assert d < 2.0 ** -9 and bf16(1.0 - d) == 1.0
    row = table.loc["bf16"]
    assert row["steps_that_changed_w"] == 0 and row["final_w"] == 1.0
    assert row["ulp_at_w0"] == 2.0 ** -7 and row["gap_toward_update"] == 2.0 ** -8
    assert row["delta_over_half_ulp"] == pytest.approx(1e-4 / 2.0 ** -8)


def test_fp16_count_matches_numpy_loop(table):
    for delta in (1e-4, 3e-4, 1e-3):
        w, d = np.float16(1.0), np.float16(delta)
        values = [float(w)]
        for _ in range(1000):
            w = np.float16(w - d)
            values.append(float(w))
        res = stagnation.run(CPU, delta=delta).table("w <- w - delta, 1000 steps").set_index("regime")
        assert res.loc["fp16", "steps_that_changed_w"] == count_changes(values), delta
        assert res.loc["fp16", "final_w"] == values[-1], delta
    assert table.loc["fp16", "steps_that_changed_w"] == 0


def test_fp32_master_copies_match_numpy(table):
    m, d = np.float32(1.0), np.float32(1e-4)
    masters = [m]
    for _ in range(1000):
        m = np.float32(m - d)
        masters.append(m)
    expected = 1.0 - 1000 * 1e-4
    for name, cast in (("fp16 + fp32 master", lambda v: float(np.float16(v))),
                       ("bf16 + fp32 master", lambda v: bf16(float(v)))):
        row = table.loc[name]
        copies = [cast(v) for v in masters]
        assert row["final_master"] == float(m)
        assert row["steps_that_changed_w"] == count_changes(copies) > 0
        assert row["final_w"] == copies[-1]
    # each fp32 subtraction in [0.5, 1] rounds by at most half of 2**-24
    assert abs(table.loc["bf16 + fp32 master", "final_master"] - expected) <= 1000 * 2.0 ** -25 + 1e-8
    assert table.loc["fp32", "steps_that_changed_w"] == 1000


def test_arguments_defaults_and_tables():
    parser = argparse.ArgumentParser()
    stagnation.add_arguments(parser)
    assert vars(parser.parse_args([])) == {"w0": 1.0, "delta": 1e-4, "steps": 1000}
    res = stagnation.run(CPU, **vars(parser.parse_args(["--steps", "10"])))
    assert [t for t, _ in res.tables] == ["w <- w - delta, 10 steps"]
    assert list(res.tables[0][1]["regime"]) == [r.name for r in stagnation.REGIMES]
    assert res.notes and json.dumps(res.to_dict(), allow_nan=False)


def test_notes_explain_with_computed_spacing():
    res = stagnation.run(CPU)
    bf16_note = next(n for n in res.notes if n.startswith("bf16:"))
    assert "0 of 1000 steps" in bf16_note and "0.00390625" in bf16_note


@pytest.mark.parametrize("options, flag", [
    ({"steps": 0}, "--steps"), ({"w0": float("inf")}, "--w0"), ({"w0": 1e6}, "--w0"),
    ({"delta": float("nan")}, "--delta"),
])
def test_bad_options_raise_value_error(options, flag):
    with pytest.raises(ValueError, match=flag):
        stagnation.run(CPU, **options)
