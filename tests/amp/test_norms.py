"""norms: the explicit norms' failure modes, checked against numpy float16 and Python floats."""

from __future__ import annotations

import argparse
import inspect
import math
import statistics

import numpy as np
import pytest
import torch

from lmperf.questions.amp import norms

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def result():
    return norms.run(CPU)


def test_x_1e3_in_fp16_squares_to_inf_and_1_over_rms_to_zero():
    trace = norms.rms_norm_explicit(torch.tensor([1e3], dtype=torch.float16))
    # numpy float16 on its own: 1000^2 = 1e6 is past fp16's largest value, and 1/sqrt(inf) = 0
    with np.errstate(over="ignore"):
        sq = np.float16(1e3) * np.float16(1e3)
    assert np.isinf(sq) and np.float16(1) / np.sqrt(sq) == 0
    assert torch.isinf(trace.squared).all() and trace.inv.item() == 0.0
    assert norms.trace_flags(trace) == {"x_squared_overflowed": True, "inv_rms_underflowed": True,
                                        "eps_absorbed": True}


def test_x_1e3_in_bf16_keeps_1_over_rms():
    trace = norms.rms_norm_explicit(torch.tensor([1e3], dtype=torch.bfloat16), eps=0.0)
    assert trace.inv.item() == pytest.approx(1e-3, rel=0.01)
    assert not norms.trace_flags(trace)["x_squared_overflowed"]


def test_seed_example_table(result):
    t = result.table("1/rms of the row [1000]").set_index("dtype")
    assert t.loc["float16", "x_squared"] == math.inf and t.loc["float16", "inv_rms"] == 0.0
    assert t.loc["float16", "rel_error"] == 1.0
    assert t.loc["bfloat16", "rel_error"] < 0.01 and t.loc["float32", "rel_error"] < 1e-6


def test_fp32_rms_norm_matches_python_floats():
    row = [0.5, -3.0, 1e3, 7.25, -0.125]
    eps = 1e-5
    rms = math.sqrt(math.fsum(v * v for v in row) / len(row) + eps)
    expected = [v / rms for v in row]
    got = norms.rms_norm_explicit(torch.tensor([row], dtype=torch.float32), eps).out[0].tolist()
    assert got == pytest.approx(expected, rel=1e-6)


def test_fp32_errors_small_and_fp16_breaks_where_numpy_says_x2_overflows(result):
    for title in ("RMSNorm written out, per input magnitude", "LayerNorm written out, per input magnitude"):
        t = result.table(title)
        fp32 = t[t["dtype"] == "float32"]
        assert fp32["finite"].all() and (fp32["max_rel_error"] < 1e-5).all()
    t = result.table("RMSNorm written out, per input magnitude")
    fp16 = t[t["dtype"] == "float16"]
    # each row's largest |x| is exactly the scale, so x^2 overflows iff numpy's fp16 square is inf
    with np.errstate(over="ignore"):
        expected = [bool(np.isinf(np.float16(s) * np.float16(s))) for s in fp16["max_abs_x"]]
    assert fp16["x_squared_overflowed"].tolist() == expected
    assert any(expected) and not all(expected)
    # where x^2 overflows, 1/rms is 0 and the output is all zeros: 100% off
    broken = fp16[fp16["x_squared_overflowed"]]
    assert broken["inv_rms_underflowed"].all() and (broken["max_rel_error"] == 1.0).all()
    assert (fp16[~fp16["x_squared_overflowed"]]["max_rel_error"] < 0.01).all()


def test_eps_1e5_in_fp16_is_stored_as_numpy_float16_subnormal(result):
    t = result.table("eps stored in each dtype").set_index("dtype")
    stored = np.float16(1e-5)
    smallest_normal = 2.0 ** -14  # fp16: 5 exponent bits, bias 15
    assert smallest_normal == float(np.finfo(np.float16).tiny)
    assert 0 < stored < smallest_normal  # so 1e-5 is subnormal in fp16
    assert t.loc["float16", "eps_stored"] == float(stored) and t.loc["float16", "eps_subnormal"]
    assert not t.loc["bfloat16", "eps_subnormal"] and not t.loc["float32", "eps_subnormal"]


def test_one_pass_variance_cancels_in_fp32_two_pass_does_not():
    gen = torch.Generator().manual_seed(1)
    x = (1e3 + torch.randn(4, 64, generator=gen, dtype=torch.float64)).float()
    exact = [statistics.pvariance(row) for row in x.double().tolist()]  # exact on the stored values
    two = norms.layer_norm_explicit(x).stat.squeeze(-1).tolist()
    one = norms.layer_norm_explicit(x, one_pass=True).stat.squeeze(-1).tolist()
    assert two == pytest.approx(exact, rel=1e-4)
    assert max(abs(o - e) / e for o, e in zip(one, exact)) > 0.01


def test_small_variance_table_blames_storage_in_low_precision(result):
    t = result.table("LayerNorm of small-variance rows")
    # at std 1e-4 around 1e3 neither fp16 (spacing 0.5) nor bf16 (spacing 4) can hold the spread
    low = t[(t["noise_std"] == 1e-4) & t["dtype"].isin(["float16", "bfloat16"])]
    assert (low["input_rounding_rel_error"] >= 0.99).all()
    spacing = t.drop_duplicates("dtype").set_index("dtype")["spacing_at_offset"]
    assert spacing["float16"] == float(np.spacing(np.float16(1e3)))
    assert spacing["float32"] == float(np.spacing(np.float32(1e3)))


def test_autocast_rms_norm_stays_finite_at_every_scale(result):
    t = result.table("built-in norms under autocast, per input magnitude")
    rms = t[t["norm"] == "lmperf RMSNorm"]
    assert rms["finite"].all() and (rms["max_rel_error"] < 0.02).all()
    # lmperf's RMSNorm casts back to its input's dtype
    assert (rms["out_dtype"] == rms["autocast_dtype"]).all()


def test_notes_are_built_from_values(result):
    assert any("float16 x^2 = inf" in n for n in result.notes)
    assert any("first breaks at max|x| = 1000" in n for n in result.notes)


def test_options_parse_to_run_keywords():
    parser = argparse.ArgumentParser()
    norms.add_arguments(parser)
    args = vars(parser.parse_args(["--scales", "1", "1e3", "--dim", "8"]))
    assert set(args) == set(inspect.signature(norms.run).parameters) - {"device"}
    r = norms.run(CPU, **args)
    assert r.params["scales"] == [1.0, 1000.0] and r.params["dim"] == 8


@pytest.mark.parametrize("bad", [{"dim": 0}, {"rows": -1}, {"scales": []}, {"scales": [-1.0]},
                                 {"noise_stds": [0.0]}, {"offset": math.nan}])
def test_bad_options_raise_value_error(bad):
    with pytest.raises(ValueError):
        norms.run(CPU, **bad)


def test_global_state_left_alone():
    rng = torch.get_rng_state()
    norms.run(CPU, scales=[1.0], noise_stds=[1.0])
    assert torch.equal(rng, torch.get_rng_state())
    assert not torch.is_autocast_enabled("cpu")


def test_same_seed_same_result():
    a = norms.run(CPU, scales=[1.0, 1e3], noise_stds=[1.0], seed=3)
    b = norms.run(CPU, scales=[1.0, 1e3], noise_stds=[1.0], seed=3)
    assert a.to_dict() == b.to_dict()
