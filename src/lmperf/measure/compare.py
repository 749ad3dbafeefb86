"""Is NEW faster than BASE? The ratio of medians of raw timing samples, its bootstrap confidence
interval, and a verdict that needs both significance and a minimum effect.

The method (ratio of medians, a seeded percentile bootstrap resampled run by run when a side
has several runs, a verdict that needs the interval to exclude 1 AND a minimum effect, symmetric
in log space) and its false-alarm and detection rates: docs/commands/compare.md and
docs/accuracy.md. A loaded machine is judged by the caller (lmperf.questions.compare.rows), which
asks `loaded_min_effect` for a wider minimum effect for one run per side; these functions see
samples only.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np

LEVEL = 0.95          # two-sided confidence level of the interval
MIN_EFFECT = 0.15     # smallest change reported, as a fraction (docs/commands/compare.md)
RESAMPLES = 2000      # bootstrap resamples per comparison
MIN_SAMPLES = 3       # fewer samples on a side: no interval, no verdict
# The minimum effect for one run per side on a loaded machine (`loaded_min_effect`): the
# run-to-run change of a phase under load, and a factor on the runs' IQR/median; calibrated in
# docs/accuracy.md ("compare: false alarms and detection").
LOADED_MIN_EFFECT = 0.45
SPREAD_FACTOR = 2.0

SLOWER, FASTER, SAME, TOO_FEW = "slower", "faster", "no significant change", "too few samples"
INCONCLUSIVE = "inconclusive"  # a change was seen, but the machine was too loaded to trust it
VERDICTS: tuple[str, ...] = (SLOWER, FASTER, SAME, INCONCLUSIVE, TOO_FEW)


@dataclass(frozen=True)
class RatioEstimate:
    """One phase compared: medians (ms), sample counts, NEW/BASE ratio with its CI, verdict."""

    base_median: float
    new_median: float
    base_n: int
    new_n: int
    ratio: float
    ci_low: float
    ci_high: float
    verdict: str

    @property
    def change_pct(self) -> float:
        """(ratio - 1) in percent: +100 is twice as slow, -50 twice as fast."""
        return (self.ratio - 1.0) * 100.0


def seed_for(label: str, seed: int = 0) -> list[int]:
    """A generator seed for one comparison: `seed` and a checksum of its label, so that a row's
    interval does not depend on which other rows were compared in the same call."""
    return [int(seed), zlib.crc32(label.encode("utf-8"))]


Groups = Sequence[Sequence[float]]


def _bootstrap_medians(groups: Groups, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(resamples,) medians of bootstrap resamples of one side.

    One group: resample its samples with replacement. Several groups (separate runs of one spec,
    or rounds): resample the groups, then the samples inside each drawn group (a two-level
    bootstrap), so that the run-to-run variation a shared machine adds is inside the interval.
    """
    sizes = np.array([len(g) for g in groups])
    padded = np.full((len(groups), sizes.max()), np.nan)  # (groups, longest group), NaN-padded
    for i, g in enumerate(groups):
        padded[i, : len(g)] = g
    if len(groups) == 1:
        picks = np.zeros((resamples, 1), dtype=int)
    else:
        picks = rng.integers(0, len(groups), size=(resamples, len(groups)))
    # (resamples, groups drawn, longest group): a uniform index below each drawn group's size
    idx = (rng.random((*picks.shape, sizes.max())) * sizes[picks][..., None]).astype(int)
    values = padded[picks[..., None], idx]
    # a drawn group contributes as many samples as it has
    values[np.arange(sizes.max()) >= sizes[picks][..., None]] = np.nan
    return np.nanmedian(values.reshape(resamples, -1), axis=1)


def _as_groups(samples: Sequence[float] | Groups) -> list[list[float]]:
    """A flat list of samples as one group; a list of lists as it is (empty groups dropped)."""
    if len(samples) and isinstance(samples[0], (list, tuple, np.ndarray)):
        return [[float(x) for x in g] for g in samples if len(g)]
    return [[float(x) for x in samples]] if len(samples) else []


def median_ratio_ci(base: Sequence[float] | Groups, new: Sequence[float] | Groups, *,
                    level: float = LEVEL, resamples: int = RESAMPLES,
                    seed: int | Sequence[int] = 0) -> tuple[float, float, float]:
    """(ratio, low, high): median(new) / median(base) over all samples, and its percentile-
    bootstrap interval at confidence `level`. Each side is a list of samples, or a list of
    groups of samples (runs, rounds) resampled at both levels. Raises ValueError for an empty
    side or a non-positive base median."""
    b, n = _as_groups(base), _as_groups(new)
    if not b or not n:
        raise ValueError("both sides need at least one sample")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    base_median = float(np.median(np.concatenate(b)))
    if base_median <= 0:
        raise ValueError(f"the base median must be positive, got {base_median}")
    ratio = float(np.median(np.concatenate(n))) / base_median
    rng = np.random.default_rng(seed)
    boot_b = _bootstrap_medians(b, resamples, rng)
    boot_n = _bootstrap_medians(n, resamples, rng)
    ratios = boot_n / np.maximum(boot_b, np.finfo(float).tiny)
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(ratios, [alpha, 1.0 - alpha])
    return ratio, float(low), float(high)


def verdict(ratio: float, low: float, high: float, min_effect: float = MIN_EFFECT) -> str:
    """'slower' when the interval lies above 1 and ratio > 1 + min_effect, 'faster' when it lies
    below 1 and ratio < 1 / (1 + min_effect), else 'no significant change'."""
    if any(math.isnan(x) for x in (ratio, low, high)):
        return TOO_FEW
    if low > 1.0 and ratio > 1.0 + min_effect:
        return SLOWER
    if high < 1.0 and ratio < 1.0 / (1.0 + min_effect):
        return FASTER
    return SAME


def compare_samples(base: Sequence[float] | Groups, new: Sequence[float] | Groups, *,
                    level: float = LEVEL, min_effect: float = MIN_EFFECT,
                    resamples: int = RESAMPLES, seed: int | Sequence[int] = 0) -> RatioEstimate:
    """Compare two sets of raw timing samples (ms), each flat or grouped by run (see
    `median_ratio_ci`). With fewer than MIN_SAMPLES on a side the ratio of medians is still
    given, without an interval, and the verdict is 'too few samples'."""
    b, n = _as_groups(base), _as_groups(new)
    flat_b, flat_n = [x for g in b for x in g], [x for g in n for x in g]
    if not flat_b or not flat_n:
        raise ValueError("both sides need at least one sample")
    base_median, new_median = float(np.median(flat_b)), float(np.median(flat_n))
    if min(len(flat_b), len(flat_n)) < MIN_SAMPLES:
        ratio = new_median / base_median if base_median > 0 else math.nan
        return RatioEstimate(base_median, new_median, len(flat_b), len(flat_n), ratio,
                             math.nan, math.nan, TOO_FEW)
    ratio, low, high = median_ratio_ci(b, n, level=level, resamples=resamples, seed=seed)
    return RatioEstimate(base_median, new_median, len(flat_b), len(flat_n), ratio, low, high,
                         verdict(ratio, low, high, min_effect))


def spread(samples: Sequence[float] | Groups) -> float:
    """IQR / median of all the samples of one side (NaN without samples)."""
    xs = np.concatenate(_as_groups(samples) or [[math.nan]])
    q1, median, q3 = np.percentile(xs, [25, 50, 75])
    return float((q3 - q1) / median) if median > 0 else math.nan


def loaded_min_effect(base: Sequence[float] | Groups, new: Sequence[float] | Groups,
                      min_effect: float = MIN_EFFECT) -> tuple[float, str]:
    """(minimum effect, what set it: '--min-effect', 'load' or 'spread') for one run per side on
    a loaded machine: the largest of `min_effect`, LOADED_MIN_EFFECT (run-to-run under load) and
    SPREAD_FACTOR x the larger IQR/median of the two sides' samples."""
    spreads = [s for s in (spread(base), spread(new)) if not math.isnan(s)]  # NaN: no spread
    own = SPREAD_FACTOR * max(spreads + [0.0])
    return max((min_effect, "--min-effect"), (LOADED_MIN_EFFECT, "load"), (own, "spread"),
               key=lambda c: c[0])
