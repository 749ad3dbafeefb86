"""softmax: exp overflow thresholds, naive vs stable softmax / softplus, checked against numpy and math."""

from __future__ import annotations

import argparse
import inspect
import math

import numpy as np
import pytest
import torch

from lmperf.questions.amp import softmax

CPU = torch.device("cpu")
ALL = (torch.float32, torch.bfloat16, torch.float16)


@pytest.fixture(scope="module")
def result():
    return softmax.run(CPU)


def test_fp16_exp_threshold_agrees_with_numpy_float16():
    largest, nxt, _ = softmax.exp_overflow_threshold(torch.float16, CPU)
    a, b = np.float16(largest), np.float16(nxt)
    assert float(a) == largest and float(b) == nxt  # both are fp16 values
    assert np.nextafter(a, np.float16(np.inf)) == b  # and neighbours
    with np.errstate(over="ignore"):
        assert np.isfinite(np.exp(a)) and np.isinf(np.exp(b))
    assert largest <= math.log(65504) < nxt  # log of fp16's largest finite value, 11.09
    assert largest == pytest.approx(11.09, abs=0.01)


def test_fp32_exp_threshold_agrees_with_numpy_float32():
    largest, nxt, _ = softmax.exp_overflow_threshold(torch.float32, CPU)
    a = np.float32(largest)
    assert np.nextafter(a, np.float32(np.inf)) == np.float32(nxt)
    with np.errstate(over="ignore"):
        assert np.isfinite(np.exp(a)) and np.isinf(np.exp(np.float32(nxt)))


def test_exp_overflow_table_is_next_to_finfo_log_max(result):
    t = result.table("exp overflow").set_index("dtype")
    for name in ("float32", "bfloat16", "float16", "float64"):
        r = t.loc[name]
        assert r["log_of_max_finite"] == math.log(torch.finfo(getattr(torch, name)).max)
        assert math.isfinite(r["exp_of_largest"]) and math.isinf(r["exp_of_next"])
        # within one step of the format around log(max): fp16's step there is 2**-7, bf16's 0.5
        assert 0 <= r["gap_to_log_max"] <= r["next_x"] - r["largest_x_exp_finite"]


def test_naive_softmax_of_0_100_in_fp16_overflows_stable_does_not():
    x = torch.tensor([0.0, 100.0], dtype=torch.float16)
    assert not torch.isfinite(softmax.naive_softmax(x)).all()
    got = softmax.stable_softmax(x).tolist()
    e = math.exp(-100)
    expected = [float(np.float16(e / (1 + e))), float(np.float16(1 / (1 + e)))]
    assert got == expected == [0.0, 1.0]


@pytest.mark.parametrize("dtype", ALL)
def test_stable_softplus_finite_at_1e4(dtype):
    x = torch.tensor([1e4, -1e4, 0.0], dtype=dtype)
    y = softmax.stable_softplus(x)
    assert torch.isfinite(y).all()
    stored = torch.tensor(1e4, dtype=dtype).item()  # bf16 holds 1e4 as 9984
    assert y.tolist() == pytest.approx([stored, 0.0, math.log(2)], rel=4e-3, abs=1e-30)
    assert not torch.isfinite(softmax.naive_softplus(x)).all()


def test_softmax_table_matches_each_dtypes_threshold(result):
    t = result.table("softmax per logit magnitude")
    limits = result.table("exp overflow").set_index("dtype")["largest_x_exp_finite"]
    # each row's max logit is exactly the magnitude, so naive softmax is finite iff the stored max
    # logit is at or under the dtype's threshold
    for _, r in t.iterrows():
        stored = torch.tensor(r["max_logit"], dtype=getattr(torch, r["dtype"])).item()
        assert r["naive_finite"] == (stored <= limits[r["dtype"]]), (r["dtype"], r["max_logit"])
    assert t["stable_finite"].all() and t["torch_finite"].all()
    assert (t["stable_max_abs_error"] < 0.01).all()


def test_softplus_table_matches_each_dtypes_threshold(result):
    t = result.table("softplus per input magnitude")
    limits = result.table("exp overflow").set_index("dtype")["largest_x_exp_finite"]
    for _, r in t.iterrows():
        stored = torch.tensor(r["max_x"], dtype=getattr(torch, r["dtype"])).item()
        assert r["naive_finite"] == (stored <= limits[r["dtype"]]), (r["dtype"], r["max_x"])
    assert t["stable_finite"].all() and t["F_softplus_finite"].all()
    assert (t["stable_max_rel_error"] < 0.01).all()
    # the error is relative to the largest |reference|: one row recomputed by hand
    row = t[(t["max_x"] == 500.0) & (t["dtype"] == "bfloat16")].iloc[0]
    magnitudes = sorted(softmax.DEFAULT_MAGNITUDES)  # as run() sorts them; default seed 0
    x = softmax.logit_rows(magnitudes, seed=0)[magnitudes.index(500.0)].to(torch.bfloat16)
    ref = softmax.stable_softplus(x.double())
    y = softmax.stable_softplus(x).double()
    assert row["stable_max_rel_error"] == (y - ref).abs().max().item() / ref.abs().max().item()


def test_attention_logits_scaled_by_sqrt_d(result):
    t = result.table("attention logits q.k")
    assert t["max_abs_logit_scaled"].tolist() == pytest.approx(
        (t["max_abs_logit"] / np.sqrt(t["d"])).tolist(), rel=1e-6)
    assert t["stable_fp16_finite"].all() and t["naive_fp16_scaled_finite"].all()
    # naive fp16 softmax overflows exactly where the max logit is past fp16's exp threshold
    assert (t["naive_fp16_finite"] == ~t["max_logit_above_fp16_exp_limit"]).all()


def test_logit_rows_have_max_equal_to_magnitude():
    rows = softmax.logit_rows([1.0, 10.0, 500.0], seed=5)
    assert rows.amax(-1).tolist() == [1.0, 10.0, 500.0]
    assert torch.equal(rows, softmax.logit_rows([1.0, 10.0, 500.0], seed=5))


def test_options_parse_to_run_keywords():
    parser = argparse.ArgumentParser()
    softmax.add_arguments(parser)
    args = vars(parser.parse_args(["--dims", "8", "--magnitudes", "100", "1"]))
    assert set(args) == set(inspect.signature(softmax.run).parameters) - {"device"}
    r = softmax.run(CPU, **args)
    assert r.params["magnitudes"] == [1.0, 100.0] and r.table("attention logits q.k")["d"].tolist() == [8]


@pytest.mark.parametrize("bad", [{"magnitudes": []}, {"magnitudes": [0.0]}, {"dims": [0]},
                                 {"dims": [2.5]}, {"tokens": 0}])
def test_bad_options_raise_value_error(bad):
    with pytest.raises(ValueError):
        softmax.run(CPU, **bad)


def test_global_rng_untouched_and_reproducible():
    rng = torch.get_rng_state()
    a = softmax.run(CPU, seed=2).to_dict()
    assert torch.equal(rng, torch.get_rng_state())
    assert a == softmax.run(CPU, seed=2).to_dict()
