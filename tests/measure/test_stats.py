"""Summary statistics against numpy, and the spread warnings."""

from __future__ import annotations

import numpy as np
import pytest

from lmperf.measure.stats import NOISY_IQR_RATIO, VERY_NOISY_IQR_RATIO, spread_warning, summarize

SAMPLE_SETS = [
    [1.0, 2.0],
    [3.0, 1.0, 2.0],
    [5.0, 1.0, 4.0, 2.0],
    [10.0, 12.5, 9.75, 30.0, 11.0],
    [0.1, 0.1, 0.1, 0.2, 0.3, 0.5, 0.8, 1.3, 2.1, 3.4],
    list(np.random.default_rng(0).lognormal(1.0, 0.5, size=37)),
    list(np.random.default_rng(1).normal(100.0, 5.0, size=200)),
]


@pytest.mark.parametrize("samples", SAMPLE_SETS, ids=lambda s: f"n{len(s)}")
def test_summarize_matches_numpy(samples):
    s = summarize(samples)
    a = np.asarray(samples, dtype=float)
    assert s["n"] == len(samples)
    assert s["samples"] == [float(x) for x in samples]
    assert s["mean"] == pytest.approx(np.mean(a), rel=1e-12)
    assert s["std"] == pytest.approx(np.std(a, ddof=1), rel=1e-12)
    assert s["median"] == pytest.approx(np.median(a), rel=1e-12)
    assert s["min"] == np.min(a) and s["max"] == np.max(a)
    q1, q3 = np.percentile(a, [25, 75])  # numpy's default: method="linear"
    assert s["iqr"] == pytest.approx(q3 - q1, rel=1e-12, abs=1e-12)


def test_summarize_known_values():
    s = summarize([1, 2, 3, 4])
    assert s["mean"] == 2.5 and s["median"] == 2.5
    assert s["iqr"] == pytest.approx(3.25 - 1.75)       # linear: 1.75 and 3.25
    assert s["std"] == pytest.approx((5 / 3) ** 0.5)    # sample std, not population (1.118)


def test_summarize_converts_to_float_and_copies():
    src = [1, 2, 3]
    s = summarize(src)
    assert all(type(x) is float for x in s["samples"])
    src.append(100)
    assert s["samples"] == [1.0, 2.0, 3.0]
    # accepts any sequence, e.g. a tuple or numpy array
    assert summarize((1.0, 3.0))["mean"] == 2.0
    assert summarize(np.array([1.0, 3.0]))["mean"] == 2.0


def test_summarize_single_sample():
    s = summarize([7.5])
    assert s == {"samples": [7.5], "n": 1, "mean": 7.5, "std": 0.0, "median": 7.5,
                 "min": 7.5, "max": 7.5, "iqr": 0.0}


def test_summarize_constant_samples():
    s = summarize([3.0] * 6)
    assert s["std"] == 0.0 and s["iqr"] == 0.0 and s["mean"] == 3.0


@pytest.mark.parametrize("empty", [[], ()])
def test_summarize_empty_raises(empty):
    with pytest.raises(ValueError):
        summarize(empty)


# --- spread warnings -----------------------------------------------------------------------------
# Five samples centred on 10 with quartiles at 10 -+ d: IQR/median = 2d / 10 exactly.

def spread(ratio: float, median: float = 10.0) -> dict:
    d = ratio * median / 2
    s = summarize([median - 2 * d, median - d, median, median + d, median + 2 * d])
    assert s["iqr"] / s["median"] == pytest.approx(ratio)
    return s


def test_thresholds():
    assert NOISY_IQR_RATIO == 0.10 and VERY_NOISY_IQR_RATIO == 0.25


def test_tight_samples_give_none():
    assert spread_warning({"forward": summarize([10.0, 10.0, 10.01, 10.02, 10.0]),
                           "step": spread(0.05)}) is None


def test_empty_summaries_give_none():
    assert spread_warning({}) is None


def test_noisy_between_10_and_25_percent():
    msg = spread_warning({"forward": spread(0.15), "step": spread(0.02)})
    assert msg is not None
    assert "noisy" in msg and "significant" not in msg
    assert "forward 15%" in msg
    assert "step" not in msg


def test_significant_above_25_percent():
    msg = spread_warning({"backward": spread(0.40)})
    assert msg is not None
    assert "significant" in msg
    assert "backward 40%" in msg


def test_exactly_at_the_noisy_threshold_is_not_noisy():
    assert spread_warning({"forward": spread(0.10)}) is None


def test_just_above_the_noisy_threshold():
    msg = spread_warning({"forward": spread(0.12)})
    assert msg is not None and "noisy" in msg


def test_between_thresholds_just_below_significant():
    msg = spread_warning({"forward": spread(0.24)})
    assert msg is not None and "significant" not in msg and "noisy" in msg


def test_phases_with_fewer_than_4_samples_are_ignored():
    wild = summarize([1.0, 10.0, 100.0])  # IQR/median far above 25%, but n = 3
    assert wild["iqr"] / wild["median"] > 1
    assert spread_warning({"forward": wild}) is None
    msg = spread_warning({"forward": wild, "step": spread(0.15)})
    assert msg is not None and "forward" not in msg and "step 15%" in msg


def test_four_samples_are_judged():
    s = summarize([5.0, 10.0, 10.0, 20.0])
    assert s["n"] == 4 and s["iqr"] / s["median"] > 0.25
    assert "significant" in spread_warning({"forward": s})


def test_names_each_noisy_phase():
    msg = spread_warning({"forward": spread(0.15), "backward": spread(0.01),
                          "optimizer": spread(0.20), "step": spread(0.50)})
    assert msg is not None
    assert "forward 15%" in msg and "optimizer 20%" in msg and "step 50%" in msg
    assert "backward" not in msg
    assert "significant" in msg  # judged by the worst phase


def test_all_noisy_below_significant_says_noisy():
    msg = spread_warning({"forward": spread(0.15), "step": spread(0.20)})
    assert "forward 15%" in msg and "step 20%" in msg
    assert "noisy" in msg and "significant" not in msg
