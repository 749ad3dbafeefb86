"""underflow: the population's flush/subnormal/overflow fractions against numpy float16, the fp16
backward with and without a loss scale, and GradScaler's backoff and growth."""

from __future__ import annotations

import argparse
import inspect

import numpy as np
import pytest
import torch

from lmperf.questions.amp import underflow

CPU = torch.device("cpu")
TITLE_POP = "synthetic gradients cast after scaling by S"


@pytest.fixture(scope="module")
def result():
    return underflow.run(CPU)


@pytest.fixture(scope="module")
def population(result):
    return underflow.gradient_population(result.params["count"], result.params["seed"]).numpy()


def _row(result, dtype: str, scale: float):
    t = result.table(TITLE_POP)
    return t[(t["dtype"] == dtype) & (t["scale"] == scale)].iloc[0]


def test_population_is_log_uniform_in_range_with_both_signs(population):
    mags = np.abs(population)
    assert mags.min() >= 1e-12 and mags.max() <= 1e2
    assert 0.45 < np.mean(population > 0) < 0.55
    # log-uniform over 14 decades: about 1/14 of the values in each decade
    counts = np.histogram(np.log10(mags), bins=14, range=(-12, 2))[0] / mags.size
    assert np.all(np.abs(counts - 1 / 14) < 0.01)


def test_fp16_flushes_exactly_the_values_below_half_the_smallest_subnormal(result, population):
    half_smallest_subnormal = 2.0 ** -25  # fp16's smallest subnormal is 2**-24
    expected = np.mean(np.abs(population) <= half_smallest_subnormal)
    assert expected == np.mean(population.astype(np.float16) == 0)  # numpy's own cast agrees
    row = _row(result, "float16", 1.0)
    assert row["flushed_fraction"] == pytest.approx(expected, abs=1e-12)
    as16 = np.abs(population.astype(np.float16))
    subnormal = np.mean((as16 > 0) & (as16 < 2.0 ** -14))
    assert row["subnormal_fraction"] == pytest.approx(subnormal, abs=1e-12)
    assert 0.25 < expected < 0.4  # (log10(2**-25) + 12) / 14 of a log-uniform population


def test_bf16_flushes_fewer_than_fp16(result):
    for scale in result.params["scales"]:
        assert _row(result, "bfloat16", scale)["flushed_fraction"] < _row(result, "float16", 1.0)["flushed_fraction"]
    assert _row(result, "bfloat16", 1.0)["flushed_fraction"] == 0.0


def test_overflow_at_the_largest_scale_matches_numpy(result, population):
    big = max(result.params["scales"])
    with np.errstate(over="ignore"):
        expected = np.mean(np.isinf((population * big).astype(np.float16)))
    row = _row(result, "float16", big)
    assert row["overflow_fraction"] == pytest.approx(expected, abs=1e-12) and expected > 0
    assert _row(result, "float16", 1.0)["overflow_fraction"] == 0.0
    assert _row(result, "bfloat16", big)["overflow_fraction"] == 0.0


def test_fractions_add_up(result):
    t = result.table(TITLE_POP)
    total = t[["flushed_fraction", "subnormal_fraction", "overflow_fraction", "normal_fraction"]].sum(axis=1)
    assert np.allclose(total, 1.0)


def test_format_thresholds(result):
    t = result.table("format thresholds").set_index("dtype")
    assert t.loc["float16", "smallest_subnormal"] == 2.0 ** -24
    assert t.loc["float16", "smallest_normal"] == 2.0 ** -14 and t.loc["float16", "largest_finite"] == 65504.0
    assert t.loc["bfloat16", "smallest_subnormal"] == 2.0 ** -133
    assert t.loc["bfloat16", "smallest_normal"] == float(np.finfo(np.float32).tiny)


def test_fp16_backward_loses_gradients_and_scaling_recovers_them(result):
    t = next(df for title, df in result.tables if title.startswith("fp16-true MLP backward"))
    ref = t[t["variant"] == "fp32 reference"].iloc[0]
    fp16 = t[t["variant"] == "fp16-true"].set_index("scale")
    assert ref["zero_fraction"] == 0.0
    assert fp16.loc[1.0, "zero_fraction"] > 0.1 and fp16.loc[1.0, "rel_error"] > 0.1
    assert fp16.loc[2.0 ** 16, "zero_fraction"] == 0.0 and fp16.loc[2.0 ** 16, "rel_error"] < 0.005
    assert fp16.loc[2.0 ** 16, "median_abs_grad"] == pytest.approx(ref["median_abs_grad"], rel=0.01)
    assert (fp16["nonfinite_fraction"] == 0).all()
    bf16 = t[t["variant"] == "bf16-true"].iloc[0]
    assert bf16["zero_fraction"] == 0.0  # bf16 keeps fp32's exponent range


def _expected_scales(init: float, steps: int, inf_step: int, interval: int) -> list[float]:
    """GradScaler's rule written out: halve on an inf step, double after `interval` clean ones."""
    scale, clean, out = init, 0, []
    for step in range(1, steps + 1):
        if step == inf_step:
            scale, clean = scale / 2, 0
        else:
            clean += 1
            if clean == interval:
                scale, clean = scale * 2, 0
        out.append(scale)
    return out


def test_grad_scaler_skips_the_injected_step_halves_then_grows(result):
    t = result.table("GradScaler per step")
    p = result.params
    inj = t[t["inf_injected"]]
    assert inj["step"].tolist() == [p["inf_step"]]
    assert inj["step_skipped"].all() and not inj["grads_finite"].any()
    assert inj["scale_factor"].tolist() == [0.5]
    assert not t[~t["inf_injected"]]["step_skipped"].any()
    assert t["scale_after"].tolist() == _expected_scales(p["init_scale"], p["steps"], p["inf_step"],
                                                         p["growth_interval"])
    assert (t["scale_factor"] == 2.0).sum() >= 2


def test_grad_scaler_follows_another_growth_interval():
    t = underflow.grad_scaler_table(CPU, seed=1, steps=8, inf_step=2, growth_interval=2,
                                    init_scale=256.0)
    assert t["scale_after"].tolist() == _expected_scales(256.0, 8, 2, 2)


def test_plot_writes_a_png(result, tmp_path):
    path = tmp_path / "underflow.png"
    underflow.plot(result, path)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_options_parse_to_run_keywords():
    parser = argparse.ArgumentParser()
    underflow.add_arguments(parser)
    args = vars(parser.parse_args(["--count", "1000", "--scales", "1", "1024", "--steps", "5"]))
    assert set(args) == set(inspect.signature(underflow.run).parameters) - {"device"}
    r = underflow.run(CPU, **args)
    assert r.params["scales"] == [1.0, 1024.0] and len(r.table("GradScaler per step")) == 5


@pytest.mark.parametrize("bad", [{"count": 0}, {"scales": []}, {"scales": [0.0]}, {"steps": 0},
                                 {"inf_step": 13}, {"growth_interval": 0}, {"loss_factor": -1.0},
                                 {"init_scale": float("inf")}])
def test_bad_options_raise_value_error(bad):
    with pytest.raises(ValueError):
        underflow.run(CPU, **bad)


def test_global_state_untouched_and_reproducible():
    rng = torch.get_rng_state()
    a = underflow.run(CPU, count=2000, steps=5, inf_step=2).to_dict()
    assert torch.equal(rng, torch.get_rng_state())
    assert not torch.is_autocast_enabled("cpu")
    assert a == underflow.run(CPU, count=2000, steps=5, inf_step=2).to_dict()
