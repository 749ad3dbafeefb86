"""Throughput, defined once for every command: tokens per second of the median step.

The median, not the mean: on a shared machine a few stalled steps (another process on the
core, a page fault storm) move the mean and not the median, and the raw samples stay in the
record for anyone who wants the mean. bench, train and dist all call this.
"""

from __future__ import annotations

STEP_STATISTIC = "median"


def tokens_per_s(tokens_per_step: int, step_ms: dict | float | None) -> float | None:
    """Tokens per second at the median step time. `step_ms` is a summary (as
    `measure.stats.summarize` returns: its 'median' is used) or the median in milliseconds;
    None when there is no positive step time."""
    median = step_ms.get(STEP_STATISTIC) if isinstance(step_ms, dict) else step_ms
    if not isinstance(median, (int, float)) or median <= 0:
        return None
    return tokens_per_step / (median / 1e3)


def step_rates(tokens_per_step: int, step_ms: dict | float | None, flops_per_step: int | None,
               peak_tflops: float | None) -> dict:
    """Tokens/s, TFLOP/s and MFU of one step, defined once (the median step, as
    `tokens_per_s`): TFLOP/s = FLOPs per step / step seconds / 1e12; MFU = TFLOP/s / the
    device's peak in the run's math dtype (None where no peak is known, e.g. on the CPU; both
    None without a FLOP count)."""
    steps_per_s = tokens_per_s(1, step_ms)
    tflops = (flops_per_step * steps_per_s / 1e12
              if steps_per_s is not None and flops_per_step is not None else None)
    return {"tokens_per_step": tokens_per_step,
            "tokens_per_s": tokens_per_s(tokens_per_step, step_ms),
            "tflops": tflops,
            "mfu": tflops / peak_tflops if (peak_tflops and tflops is not None) else None}
