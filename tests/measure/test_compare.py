"""The comparison statistics: ratio of medians, its seeded bootstrap interval, the verdict rule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lmperf.measure.compare import (FASTER, MIN_EFFECT, SAME, SLOWER, TOO_FEW, compare_samples,
                                    median_ratio_ci, seed_for, verdict)

# Skewed, timing-like samples (ms): a lognormal body around 40 ms.
BASE = list(40.0 * np.random.default_rng(0).lognormal(0.0, 0.05, size=12))
OTHER = list(40.0 * np.random.default_rng(1).lognormal(0.0, 0.05, size=12))


def test_ratio_is_the_ratio_of_medians_and_inside_its_interval():
    ratio, low, high = median_ratio_ci(BASE, [2 * x for x in OTHER])
    assert ratio == pytest.approx(2 * np.median(OTHER) / np.median(BASE))
    assert low <= ratio <= high


def test_same_distribution_is_no_significant_change():
    est = compare_samples(BASE, OTHER)
    assert est.verdict == SAME
    assert est.ci_low < 1.0 < est.ci_high or abs(est.ratio - 1) <= MIN_EFFECT


@pytest.mark.parametrize("factor, expected", [(2.0, SLOWER), (0.5, FASTER), (1.5, SLOWER)])
def test_a_real_change_is_caught(factor, expected):
    est = compare_samples(BASE, [factor * x for x in OTHER])
    assert est.verdict == expected
    assert est.ci_low <= factor * np.median(OTHER) / np.median(BASE) <= est.ci_high
    assert est.change_pct == pytest.approx((est.ratio - 1) * 100)


def test_a_significant_change_below_the_minimum_effect_is_not_reported():
    tight = [100.0 + 0.01 * i for i in range(10)]
    shifted = [x * 1.10 for x in tight]  # 10% slower, no overlap at all
    ratio, low, high = median_ratio_ci(tight, shifted)
    assert low > 1.0
    assert compare_samples(tight, shifted).verdict == SAME  # the default minimum is 15%
    assert compare_samples(tight, shifted, min_effect=0.05).verdict == SLOWER


def test_the_interval_is_reproducible_and_depends_on_the_seed():
    a = median_ratio_ci(BASE, OTHER, seed=seed_for("x"))
    assert median_ratio_ci(BASE, OTHER, seed=seed_for("x")) == a
    assert median_ratio_ci(BASE, OTHER, seed=seed_for("y")) != a


def test_a_higher_level_gives_a_wider_interval():
    _, lo90, hi90 = median_ratio_ci(BASE, OTHER, level=0.90)
    _, lo99, hi99 = median_ratio_ci(BASE, OTHER, level=0.99)
    assert lo99 <= lo90 and hi99 >= hi90


def test_too_few_samples_gives_a_ratio_but_no_verdict():
    est = compare_samples([10.0, 11.0], [20.0, 21.0])
    assert est.verdict == TOO_FEW
    assert est.ratio == pytest.approx(20.5 / 10.5)
    assert math.isnan(est.ci_low) and math.isnan(est.ci_high)


def test_verdict_rule_is_symmetric_in_log_space():
    assert verdict(1.06, 1.01, 1.10, min_effect=0.05) == SLOWER
    assert verdict(1 / 1.06, 1 / 1.10, 1 / 1.01, min_effect=0.05) == FASTER
    assert verdict(0.96, 0.90, 0.99, min_effect=0.05) == SAME  # inside 1 / 1.05
    assert verdict(1.5, 0.9, 2.0, min_effect=0.05) == SAME      # interval holds 1
    assert verdict(1.1, 1.05, 1.2) == SAME                       # below the default 15%
    assert verdict(1.2, 1.05, 1.3) == SLOWER


def test_bad_input_raises():
    with pytest.raises(ValueError):
        median_ratio_ci([], [1.0])
    with pytest.raises(ValueError):
        median_ratio_ci([0.0, 0.0], [1.0, 1.0])
    with pytest.raises(ValueError):
        median_ratio_ci([1.0], [1.0], level=1.5)


def test_several_runs_are_resampled_run_by_run():
    # BASE ran three times, the third time on a busier machine (1.4x slower); NEW once.
    third = list(1.4 * 40.0 * np.random.default_rng(3).lognormal(0.0, 0.05, size=12))
    runs = [BASE, OTHER, third]
    new = list(40.0 * np.random.default_rng(2).lognormal(0.0, 0.05, size=12))
    _, flat_low, flat_high = median_ratio_ci([x for r in runs for x in r], new)
    ratio, low, high = median_ratio_ci(runs, new)
    assert ratio == pytest.approx(np.median(new) / np.median(BASE + OTHER + third))
    # pooled as one run, the slow run hardly moves the median; resampled run by run, the
    # interval allows for a draw of mostly slow runs
    assert low < flat_low - 0.1
    assert compare_samples(runs, new).base_n == 36
