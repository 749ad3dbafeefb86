"""Summary statistics of raw timing samples, and the spread warnings they imply."""

from __future__ import annotations

import statistics
from typing import Sequence

# torch.utils.benchmark's thresholds: IQR/median above 10% is worth a warning, above 25% it says
# the environment had a significant influence on the measurement.
NOISY_IQR_RATIO = 0.10
VERY_NOISY_IQR_RATIO = 0.25


def summarize(samples: Sequence[float]) -> dict:
    """Raw samples plus n, mean, std (sample, ddof=1; 0 for one sample), median, min, max, IQR.

    IQR is the difference of the 75th and 25th percentiles (inclusive method, i.e. linear
    interpolation between order statistics, as numpy's default).
    """
    xs = [float(x) for x in samples]
    if not xs:
        raise ValueError("cannot summarise zero samples")
    if len(xs) > 1:
        q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    else:
        q1 = q3 = xs[0]
    return {
        "samples": xs,
        "n": len(xs),
        "mean": statistics.fmean(xs),
        "std": statistics.stdev(xs) if len(xs) > 1 else 0.0,
        "median": statistics.median(xs),
        "min": min(xs),
        "max": max(xs),
        "iqr": q3 - q1,
    }


def spread_warning(summaries: dict[str, dict]) -> str | None:
    """One warning naming every phase whose IQR/median says the machine was noisy, else None.

    `summaries` maps a phase name to its `summarize()` dict; phases with fewer than 4 samples
    are not judged.
    """
    ratios = {name: s["iqr"] / s["median"] for name, s in summaries.items()
              if s and s["n"] >= 4 and s["median"] > 0}
    noisy = {k: r for k, r in ratios.items() if r > NOISY_IQR_RATIO}
    if not noisy:
        return None
    listed = ", ".join(f"{k} {r:.0%}" for k, r in noisy.items())
    if max(noisy.values()) > VERY_NOISY_IQR_RATIO:
        return (f"IQR/median {listed}: the environment had a significant influence on this "
                "measurement (other load, frequency scaling or too few steps)")
    return f"IQR/median {listed}: the machine was noisy"


PHASE_NAMES: tuple[str, ...] = ("forward", "backward", "optimizer", "step")


def phase_summaries(samples: dict[str, list[float]]) -> dict[str, dict | None]:
    """'<phase>_ms' -> `summarize()` of that phase's raw samples (ms) for forward, backward,
    optimizer and step; None for a phase the run did not time (e.g. backward in forward mode)."""
    return {f"{name}_ms": summarize(samples[name]) if samples.get(name) else None
            for name in PHASE_NAMES}


def cpu_time(kind: str | None, covers: str | None, samples: dict[str, list[float]]
             ) -> dict | None:
    """The CPU-time figures of a run beside its wall times: which clock (`kind`), what it
    covers, and `phase_summaries` of the CPU milliseconds (raw samples kept). None where no CPU
    clock ran (on CUDA the host's CPU time is not the work's)."""
    if kind is None:
        return None
    return {"clock": kind, "covers": covers, **phase_summaries(samples)}
