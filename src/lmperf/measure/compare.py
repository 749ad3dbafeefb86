"""Is NEW faster than BASE? The ratio of medians of raw timing samples, its bootstrap confidence
interval, and a verdict that needs both significance and a minimum effect.

Method (chosen after reading pyperf `compare_to`, asv `compare` and torch.utils.benchmark):
- The estimate is median(NEW) / median(BASE): medians, because a neighbour's burst of load
  gives timing samples a long right tail that moves a mean but hardly a median; a ratio, so
  that phases of 5 ms and 500 ms read on one scale.
- Its confidence interval is a percentile bootstrap: both sample sets are resampled with
  replacement, independently, `resamples` times, and the interval is the central `level`
  quantile range of the resampled ratios. It assumes nothing about the shape of the
  distribution (pyperf's Student t-test assumes normal samples; timing samples are skewed),
  and it gives an interval, which a rank test (asv's Mann-Whitney U) does not. The generator is
  seeded, so the same samples always give the same interval.
- Several runs of one spec on a side (a sweep appended twice, rounds) are resampled run by run
  (a two-level bootstrap: runs, then samples inside each drawn run), so that the variation
  between runs, which one run's samples cannot show, is inside the interval.
- A change is reported only when the interval excludes 1 AND the ratio is beyond a minimum
  effect, 15% by default, as asv requires both a significant difference and a factor (and
  pyperf `--min-speed`). The interval of a single run per side cannot see run-to-run variation
  (memory placement, frequency, the neighbours), which on the 2-core development machine
  reached 10-15% in a phase between two quiet runs of the same spec, with tight intervals. Over
  512 phases of 16 pairs of quiet same-spec sweeps there (docs/benchmarks.md), no minimum
  flagged 33% of them, 5% flagged 24%, 10% 9%, 15% 3.5% and 20% 1.6%, while a model doing twice
  the work (measured 1.3x to 3.7x slower per phase) was flagged in 639 of 640 phases at every
  one of those minimums. With `--rounds 2` on each side (two rounds per spec, resampled round by
  round) none of 32 same-spec phases was flagged and all 64 of the 2x model's were: pool rounds
  before lowering `min_effect`.
The rule is symmetric in log space: 'slower' needs ratio > 1 + e, 'faster' ratio < 1 / (1 + e).
A loaded machine is judged by the caller (lmperf.questions.compare.rows: these same functions
on the CPU time of the measuring thread, or 'inconclusive' without it), not here: these
functions see samples only. Under load, though, a single run per side moves between runs by more
than 15% even in CPU time (a thread that runs part of the time finds its caches cold), and its
interval cannot see that; so for one run per side on a loaded machine the caller asks
`loaded_min_effect` for a wider minimum effect, and a change between the two is 'inconclusive'.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np

LEVEL = 0.95          # two-sided confidence level of the interval
MIN_EFFECT = 0.15     # smallest change reported, as a fraction (15%; see the module docstring)
RESAMPLES = 2000      # bootstrap resamples per comparison
MIN_SAMPLES = 3       # fewer samples on a side: no interval, no verdict
# The minimum effect for one run per side on a loaded machine (see `loaded_min_effect`): at
# least LOADED_MIN_EFFECT, the run-to-run change of a phase between separate same-spec runs under
# load, and at least SPREAD_FACTOR x the larger IQR/median of the two runs' samples (a run
# disturbed more moves more). 2-core EPYC VM, two busy processes, tiny fp32 (docs/accuracy.md):
# in 8 calibration runs (load 3-7) thread CPU time moved up to 1.31x in backward and step between
# runs and the 2x model read 1.63-2.35x there: hence 45%, between the two. In the 40 runs of the
# acceptance test (load 2.4-8.9), forward (IQR/median 30-66%) moved up to 2.1x and the optimizer
# (3 ms) 2.6x between any two runs: a factor of 1 on the spread left 8.1% of their 780 pairs
# with a phase past 25%, 2 left 2.7% (chosen there, in-sample), and 399 of 400 2x pairs failed.
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
