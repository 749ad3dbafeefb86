"""The numbers of a comparison, as rows: one per matched spec x timed phase (ratio of medians,
interval, verdict), one per matched spec for tokens/s and memory, and one per spec or phase
that could not be compared, with the reason."""

from __future__ import annotations

import math
from typing import Callable, Sequence

from lmperf.questions.compare import records as rec
from lmperf.questions.compare.match import Match, Unmatched
from lmperf.measure.compare import (FASTER, INCONCLUSIVE, SAME, SLOWER, RatioEstimate,
                                    compare_samples, loaded_min_effect, seed_for, verdict)

STAT_COLUMNS: tuple[str, ...] = (
    "phase", "base_n", "new_n", "base_median_ms", "new_median_ms", "ratio", "ci_low", "ci_high",
    "change_pct", "verdict", "judged_on", "base_cpu_median_ms", "new_cpu_median_ms", "cpu_ratio",
    "cpu_ci_low", "cpu_ci_high", "cpu_change_pct", "base_load_per_cpu", "new_load_per_cpu",
    "base_off_cpu", "new_off_cpu", "min_effect_pct", "min_effect_from")
WALL, CPU = "wall time", "CPU time"  # what a verdict was judged on
THROUGHPUT_COLUMNS: tuple[str, ...] = (
    "base_tokens_per_s", "new_tokens_per_s", "tokens_per_s_ratio", "base_peak_mib",
    "new_peak_mib", "peak_delta_mib", "memory_kind")


def cell(value: object) -> object:
    """A spec value as a frame cell: lists and dicts as text, so that columns stay hashable."""
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


def _identity(m: Match) -> dict:
    """The leading columns of a matched spec's rows: its record kind and spec fields."""
    return {"record_kind": m.kind, **{k: cell(v) for k, v in m.spec.items()}}


def _max(records: list[dict], of: Callable[[dict], float | None]) -> float:
    """The largest `of(record)` of the records that have one; NaN when none has."""
    values = [x for r in records if (x := of(r)) is not None]
    return max(values) if values else math.nan


def _groups(records: list[dict], groups_of: Callable[[dict], dict] = rec.timed_groups
            ) -> dict[str, list[list[float]]]:
    """Phase -> one group of samples per record, or per round of a record pooled over rounds
    (the groups are resampled one by one: see lmperf.measure.compare)."""
    out: dict[str, list[list[float]]] = {}
    for r in records:
        for phase, groups in groups_of(r).items():
            out.setdefault(phase, []).extend(groups)
    return out


def _cpu_groups(records: list[dict]) -> dict[str, list[list[float]]]:
    """Phase -> CPU-time groups of the records, when every record has them from the measuring
    thread's clock (the one a loaded comparison may be judged on); else {}."""
    if not records or any(rec.cpu_clock(r) != rec.JUDGED_CPU_CLOCK for r in records):
        return {}
    return _groups(records, rec.cpu_groups)


def _stat_row(phase: str, est: RatioEstimate) -> dict:
    return {"phase": phase, "base_n": est.base_n, "new_n": est.new_n,
            "base_median_ms": est.base_median, "new_median_ms": est.new_median,
            "ratio": est.ratio, "ci_low": est.ci_low, "ci_high": est.ci_high,
            "change_pct": est.change_pct, "verdict": est.verdict}


def _cpu_row(est: RatioEstimate | None) -> dict:
    columns = ("base_cpu_median_ms", "new_cpu_median_ms", "cpu_ratio", "cpu_ci_low",
               "cpu_ci_high", "cpu_change_pct")
    if est is None:
        return dict.fromkeys(columns, math.nan)
    return dict(zip(columns, (est.base_median, est.new_median, est.ratio, est.ci_low,
                              est.ci_high, est.change_pct)))


def is_loaded(loads: tuple[float, float], off_cpu: tuple[float, float],
              max_load: float | None) -> bool:
    """Whether a comparison's CPU runs were loaded: a side started above `max_load` load per CPU
    (None: never judged so), or its measuring thread was off the CPU for more than
    MAX_OFF_CPU of its median step while it ran."""
    if max_load is None:
        return False
    started = any(x > max_load for x in loads if not math.isnan(x))
    return started or any(x > rec.MAX_OFF_CPU for x in off_cpu if not math.isnan(x))


def phase_rows(matches: list[Match], *, level: float, min_effect: float, resamples: int,
               seed: int, max_load: float | None) -> tuple[list[dict], list[tuple[Match, str]]]:
    """(one row per matched spec x phase with samples on both sides, (match, reason) for the
    specs and phases that have none).

    Each row compares the wall times and, where both sides have them from the measuring
    thread's clock, the CPU times. Loaded runs (`is_loaded`) are judged on CPU time, or else a
    'slower' / 'faster' verdict becomes 'inconclusive'; with one run on a side the minimum
    effect is widened (`loaded_min_effect`). Why: docs/commands/compare.md, "busy machine".
    """
    rows, skipped = [], []
    for m in matches:
        loads = _max(m.base, rec.load_per_cpu), _max(m.new, rec.load_per_cpu)
        off = _max(m.base, rec.off_cpu), _max(m.new, rec.off_cpu)
        loaded = is_loaded(loads, off, max_load)
        base, new = _groups(m.base), _groups(m.new)
        cpu_base, cpu_new = _cpu_groups(m.base), _cpu_groups(m.new)
        if not base and not new:
            skipped.append((m, f"{m.kind} records carry no raw timing samples"))
            continue
        for phase in dict.fromkeys(list(base) + list(new)):
            if phase not in base or phase not in new:
                skipped.append((m, f"phase {phase}: samples only in "
                                   f"{'BASE' if phase in base else 'NEW'}"))
                continue
            label = f"{m.kind}|{sorted(m.spec.items())}|{phase}"
            est = compare_samples(base[phase], new[phase], level=level, min_effect=min_effect,
                                  resamples=resamples, seed=seed_for(label, seed))
            cpu_est = None
            if phase in cpu_base and phase in cpu_new:
                cpu_est = compare_samples(cpu_base[phase], cpu_new[phase], level=level,
                                          min_effect=min_effect, resamples=resamples,
                                          seed=seed_for(label + "|cpu", seed))
            row = {**_stat_row(phase, est), "judged_on": WALL, **_cpu_row(cpu_est),
                   "min_effect_pct": min_effect * 100, "min_effect_from": None}
            judged, sides = est, (base[phase], new[phase])
            if loaded and cpu_est is not None:
                judged, sides = cpu_est, (cpu_base[phase], cpu_new[phase])
                row["verdict"], row["judged_on"] = cpu_est.verdict, CPU
            elif loaded and est.verdict in (SLOWER, FASTER):
                row["verdict"] = INCONCLUSIVE
            if loaded and min(map(len, sides)) < 2:  # one run on a side: widen (see measure)
                wide, why = loaded_min_effect(*sides, min_effect)
                row["min_effect_pct"], row["min_effect_from"] = wide * 100, why
                if row["verdict"] in (SLOWER, FASTER) and verdict(
                        judged.ratio, judged.ci_low, judged.ci_high, wide) == SAME:
                    row["verdict"] = INCONCLUSIVE
            row["base_load_per_cpu"], row["new_load_per_cpu"] = loads
            row["base_off_cpu"], row["new_off_cpu"] = off
            rows.append({**_identity(m), **row})
    return rows, skipped


def judged_change(row: dict | object) -> tuple[float, float, float, float]:
    """(change_pct, ratio, ci_low, ci_high) of the clock a row's verdict was judged on."""
    if row["judged_on"] == CPU:
        return row["cpu_change_pct"], row["cpu_ratio"], row["cpu_ci_low"], row["cpu_ci_high"]
    return row["change_pct"], row["ratio"], row["ci_low"], row["ci_high"]


def _mean(values: Sequence[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None


def _ratio(a: float | None, b: float | None) -> float:
    return a / b if a is not None and b else math.nan


def _delta(a: float | None, b: float | None) -> float:
    return a - b if a is not None and b is not None else math.nan


def throughput_rows(matches: list[Match]) -> list[dict]:
    """One row per matched spec: tokens/s and peak memory (MiB) of each side (means over its
    records), their ratio and difference; a spec with neither is left out."""
    rows = []
    for m in matches:
        tps_b = _mean([rec.tokens_per_s(r) for r in m.base])
        tps_n = _mean([rec.tokens_per_s(r) for r in m.new])
        mem_b = [rec.peak_memory(r) for r in m.base]
        mem_n = [rec.peak_memory(r) for r in m.new]
        peak_b, peak_n = _mean([v for v, _ in mem_b]), _mean([v for v, _ in mem_n])
        if tps_b is None and tps_n is None and peak_b is None and peak_n is None:
            continue
        what = sorted({w for _, w in mem_b + mem_n if w})
        rows.append({**_identity(m),
                     "base_tokens_per_s": tps_b, "new_tokens_per_s": tps_n,
                     "tokens_per_s_ratio": _ratio(tps_n, tps_b),
                     "base_peak_mib": peak_b, "new_peak_mib": peak_n,
                     "peak_delta_mib": _delta(peak_n, peak_b),
                     "memory_kind": " / ".join(what) if what else None})
    return rows


def not_compared_rows(unmatched: list[Unmatched], skipped: list[tuple[Match, str]],
                      fields: Sequence[str]) -> list[dict]:
    """One row per spec (or phase) not compared: side, record kind, spec (the given fields, as
    'name=value'), reason."""
    items = [(u.side, u.kind, u.spec, u.reason) for u in unmatched]
    items += [("both", m.kind, m.spec, why) for m, why in skipped]
    return [{"side": side, "record_kind": kind,
             "spec": " ".join(f"{k}={cell(spec[k])}" for k in fields if k in spec),
             "reason": reason} for side, kind, spec, reason in items]
