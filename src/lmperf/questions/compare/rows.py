"""The numbers of a comparison, as rows: one per matched spec x timed phase (ratio of medians,
interval, verdict), one per matched spec for tokens/s and memory, and one per spec or phase
that could not be compared, with the reason."""

from __future__ import annotations

import math
from typing import Sequence

from lmperf.questions.compare import records as rec
from lmperf.questions.compare.match import Match, Unmatched
from lmperf.measure.compare import (FASTER, INCONCLUSIVE, SLOWER, RatioEstimate, compare_samples,
                                    seed_for)

STAT_COLUMNS: tuple[str, ...] = (
    "phase", "base_n", "new_n", "base_median_ms", "new_median_ms", "ratio", "ci_low", "ci_high",
    "change_pct", "verdict", "base_load_per_cpu", "new_load_per_cpu")
THROUGHPUT_COLUMNS: tuple[str, ...] = (
    "base_tokens_per_s", "new_tokens_per_s", "tokens_per_s_ratio", "base_peak_mib",
    "new_peak_mib", "peak_delta_mib", "memory_kind")


def cell(value: object) -> object:
    """A spec value as a frame cell: lists and dicts as text, so that columns stay hashable."""
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


def _identity(m: Match) -> dict:
    """The leading columns of a matched spec's rows: its record kind and spec fields."""
    return {"record_kind": m.kind, **{k: cell(v) for k, v in m.spec.items()}}


def _max_load(records: list[dict]) -> float:
    values = [x for r in records if (x := rec.load_per_cpu(r)) is not None]
    return max(values) if values else math.nan


def _groups(records: list[dict]) -> dict[str, list[list[float]]]:
    """Phase -> one group of samples per record, or per round of a record pooled over rounds
    (the groups are resampled one by one: see lmperf.measure.compare)."""
    out: dict[str, list[list[float]]] = {}
    for r in records:
        for phase, groups in rec.timed_groups(r).items():
            out.setdefault(phase, []).extend(groups)
    return out


def _stat_row(phase: str, est: RatioEstimate) -> dict:
    return {"phase": phase, "base_n": est.base_n, "new_n": est.new_n,
            "base_median_ms": est.base_median, "new_median_ms": est.new_median,
            "ratio": est.ratio, "ci_low": est.ci_low, "ci_high": est.ci_high,
            "change_pct": est.change_pct, "verdict": est.verdict}


def phase_rows(matches: list[Match], *, level: float, min_effect: float, resamples: int,
               seed: int, max_load: float | None) -> tuple[list[dict], list[tuple[Match, str]]]:
    """(one row per matched spec x phase with samples on both sides, (match, reason) for the
    specs and phases that have none). A 'slower' or 'faster' verdict becomes 'inconclusive'
    when a CPU run of either side started with more than `max_load` load per CPU."""
    rows, skipped = [], []
    for m in matches:
        loads = _max_load(m.base), _max_load(m.new)
        loaded = max_load is not None and any(x > max_load for x in loads if not math.isnan(x))
        base, new = _groups(m.base), _groups(m.new)
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
            row = _stat_row(phase, est)
            if loaded and est.verdict in (SLOWER, FASTER):
                row["verdict"] = INCONCLUSIVE
            row["base_load_per_cpu"], row["new_load_per_cpu"] = loads
            rows.append({**_identity(m), **row})
    return rows, skipped


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
