"""The Report of a comparison: one numeric row per matched spec x timed phase, a throughput and
memory table, the specs not compared (with why), and findings (method, counts, environment)."""

from __future__ import annotations

import math
from typing import Sequence

import pandas as pd

from lmperf.compare import records as rec
from lmperf.compare.match import Match, Unmatched
from lmperf.core.report import Report, caption_axes
from lmperf.measure.compare import (FASTER, INCONCLUSIVE, SAME, SLOWER, TOO_FEW, RatioEstimate,
                                    compare_samples, seed_for)

STAT_COLUMNS = ("phase", "base_n", "new_n", "base_median_ms", "new_median_ms", "ratio", "ci_low",
                "ci_high", "change_pct", "verdict", "base_load_per_cpu", "new_load_per_cpu")
# Spec fields that follow from the others shown (a preset's shape follows from its size): left
# out of the displayed table when they add nothing, kept in the frame.
DERIVED = ("d_model", "num_layers", "num_heads", "d_ff", "model_context_length")


def _scalar(value: object) -> object:
    """Spec values as frame cells: lists and dicts as text, so that columns stay hashable."""
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


def _max_load(records: list[dict]) -> float:
    values = [x for r in records if (x := rec.load_per_cpu(r)) is not None]
    return max(values) if values else math.nan


def phase_rows(matches: list[Match], *, level: float, min_effect: float, resamples: int,
               seed: int, max_load: float | None) -> tuple[list[dict], list[tuple[Match, str]]]:
    """(one row per matched spec x phase with samples on both sides, (match, reason) of specs
    or phases that could not be compared). A 'slower' or 'faster' verdict becomes
    'inconclusive' when a run of either side started with more than `max_load` load per CPU."""
    rows, skipped = [], []
    for m in matches:
        loads = _max_load(m.base), _max_load(m.new)
        loaded = max_load is not None and any(x > max_load for x in loads if x == x)
        # phase -> one group of samples per ok record, or per round of a record pooled over
        # rounds (several runs of a spec are pooled, and resampled run by run: see
        # lmperf.measure.compare)
        base_phases: dict[str, list[list[float]]] = {}
        new_phases: dict[str, list[list[float]]] = {}
        for side, pooled in ((m.base, base_phases), (m.new, new_phases)):
            for r in side:
                for phase, groups in rec.timed_groups(r).items():
                    pooled.setdefault(phase, []).extend(groups)
        if not base_phases and not new_phases:
            skipped.append((m, f"{m.kind} records carry no raw timing samples"))
            continue
        for phase in dict.fromkeys(list(base_phases) + list(new_phases)):
            if phase not in base_phases or phase not in new_phases:
                where = "BASE" if phase in base_phases else "NEW"
                skipped.append((m, f"phase {phase}: samples only in {where}"))
                continue
            label = f"{m.kind}|{sorted(m.spec.items())}|{phase}"
            est = compare_samples(base_phases[phase], new_phases[phase], level=level,
                                  min_effect=min_effect, resamples=resamples,
                                  seed=seed_for(label, seed))
            row = _stat_row(phase, est)
            if loaded and est.verdict in (SLOWER, FASTER):
                row["verdict"] = INCONCLUSIVE
            row["base_load_per_cpu"], row["new_load_per_cpu"] = loads
            rows.append({"kind": m.kind, **{k: _scalar(v) for k, v in m.spec.items()}, **row})
    return rows, skipped


def _stat_row(phase: str, est: RatioEstimate) -> dict:
    return {"phase": phase, "base_n": est.base_n, "new_n": est.new_n,
            "base_median_ms": est.base_median, "new_median_ms": est.new_median,
            "ratio": est.ratio, "ci_low": est.ci_low, "ci_high": est.ci_high,
            "change_pct": est.change_pct, "verdict": est.verdict}


def _mean(values: Sequence[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None


def _div(a: float | None, b: float | None) -> float:
    return a / b if a is not None and b else math.nan


def throughput_rows(matches: list[Match]) -> list[dict]:
    """One row per matched spec: tokens/s and peak memory of each side (mean over pooled
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
        what = {w for _, w in mem_b + mem_n if w}
        rows.append({"kind": m.kind, **{k: _scalar(v) for k, v in m.spec.items()},
                     "base_tokens_per_s": tps_b, "new_tokens_per_s": tps_n,
                     "tokens_per_s_ratio": _div(tps_n, tps_b),
                     "base_peak_mib": peak_b, "new_peak_mib": peak_n,
                     "peak_delta_mib": (peak_n - peak_b) if peak_b is not None and peak_n is not None
                     else math.nan,
                     "memory_kind": " / ".join(sorted(what)) if what else None})
    return rows


def _varying(df: pd.DataFrame, columns: Sequence[str]) -> list[str]:
    """The spec columns of `df` that take more than one value (derived shape fields only when
    the other shown columns do not already determine them)."""
    axes, _ = caption_axes(df, [(c, c) for c in columns])
    shown = [c for c, _ in axes if c not in DERIVED]
    for c, _ in axes:
        if c in DERIVED and shown and df.groupby(shown, dropna=False)[c].nunique(dropna=False).max() > 1:
            shown.append(c)
    return [c for c in columns if c in shown]


def spec_columns(df: pd.DataFrame) -> list[str]:
    """The spec-field columns of a comparison frame (everything before the statistics)."""
    stats = set(STAT_COLUMNS) | {"base_tokens_per_s", "new_tokens_per_s", "tokens_per_s_ratio",
                                 "base_peak_mib", "new_peak_mib", "peak_delta_mib", "memory_kind"}
    return [c for c in df.columns if c not in stats]


def spec_label(row: pd.Series, columns: Sequence[str]) -> str:
    """'size=tiny context_length=64' from the given spec columns of one row."""
    return " ".join(f"{c}={row[c]}" for c in columns if not (isinstance(row[c], float) and math.isnan(row[c])))


def _fmt(x: float, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def make_display(level: float):
    """The phases table for reading: spec fields that vary, then medians, 'ratio [CI]', change,
    verdict; constant spec fields in the caption."""

    def display(report: Report) -> tuple[pd.DataFrame, str, list[str]]:
        df = report.frame
        columns = spec_columns(df)
        shown = _varying(df, columns)
        _, caption = caption_axes(df, [(c, c) for c in columns if c not in shown])
        out = df[shown].copy()
        out["phase"] = df["phase"]
        out["base (ms)"] = [_fmt(x, ".2f") for x in df["base_median_ms"]]
        out["new (ms)"] = [_fmt(x, ".2f") for x in df["new_median_ms"]]
        out[f"NEW/BASE [{level:.0%} CI]"] = [
            f"{_fmt(r, '.3f')} [{_fmt(lo, '.3f')}, {_fmt(hi, '.3f')}]"
            for r, lo, hi in zip(df["ratio"], df["ci_low"], df["ci_high"])]
        out["change"] = [_fmt(x, "+.1f") + ("%" if x == x else "") for x in df["change_pct"]]
        out["verdict"] = df["verdict"]
        if (df["verdict"] == INCONCLUSIVE).any():
            out["load/CPU"] = [f"{_fmt(b, '.2f')} / {_fmt(n, '.2f')}"
                               for b, n in zip(df["base_load_per_cpu"], df["new_load_per_cpu"])]
        return out, "; ".join(p for p in (caption, "medians of the raw samples") if p), []

    return display


def counts_sentence(verdicts: Sequence[str]) -> str:
    """'2 slower, 1 faster, 29 no significant change' (only the verdicts present)."""
    parts = [f"{sum(v == name for v in verdicts)} {name}"
             for name in (SLOWER, FASTER, SAME, INCONCLUSIVE, TOO_FEW)]
    return ", ".join(p for p in parts if not p.startswith("0 "))


def not_compared_frame(unmatched: list[Unmatched], skipped: list[tuple[Match, str]],
                       vary: Sequence[str]) -> pd.DataFrame:
    """One row per spec (or phase) not compared: side, kind, spec (the fields in `vary`),
    reason."""
    rows = [(u.side, u.kind, u.spec, u.reason) for u in unmatched]
    rows += [("both", m.kind, m.spec, why) for m, why in skipped]
    return pd.DataFrame([{"side": side, "kind": kind,
                          "spec": " ".join(f"{k}={_scalar(spec[k])}" for k in vary if k in spec),
                          "reason": reason} for side, kind, spec, reason in rows])


def _short(value: object) -> str:
    """Environment values for a sentence: a git commit by its first 10 characters."""
    text = str(value)
    head, dirty = (text[:-6], "-dirty") if text.endswith("-dirty") else (text, "")
    return (head[:10] + dirty) if len(head) == 40 and all(c in "0123456789abcdef" for c in head) else text


def _env_findings(matches: list[Match], labels: tuple[str, str] = ("BASE", "NEW")) -> list[str]:
    """Warnings for environment fields that differ between the sides, and where the code
    versions and the machine's load stood."""
    out = []
    for fields, warn in ((rec.ENV_FIELDS, True), (rec.VERSION_FIELDS, False)):
        differ: dict[str, tuple[set, set]] = {}
        for m in matches:
            b = [rec.env_values(r, fields) for r in m.base]
            n = [rec.env_values(r, fields) for r in m.new]
            for f in fields:
                bv = {_short(e[f]) for e in b if f in e}
                nv = {_short(e[f]) for e in n if f in e}
                if bv and nv and bv != nv:
                    seen = differ.setdefault(f, (set(), set()))
                    seen[0].update(bv)
                    seen[1].update(nv)
        for f, (bv, nv) in differ.items():
            text = f"{f} {'/'.join(sorted(bv))} ({labels[0]}) vs {'/'.join(sorted(nv))} ({labels[1]})"
            out.append(f"warning: the environment differs, {text}: the ratios include that "
                       "difference" if warn else f"code: {text}")
    loads, cpus = [], set()
    for label, side in ((labels[0], "base"), (labels[1], "new")):
        values = [x for m in matches for r in getattr(m, side) if (x := rec.load_average(r)) is not None]
        cpus |= {(r.get("env") or {}).get("cpu_count") for m in matches for r in getattr(m, side)}
        if values:
            span = f"{min(values):.2f}" + (f"-{max(values):.2f}" if max(values) > min(values) else "")
            loads.append(f"{label} {span}")
    if loads:
        on = f" ({'/'.join(map(str, sorted(c for c in cpus if c)))} CPUs)" if cpus - {None} else ""
        out.append("1-minute load average when the runs started: " + ", ".join(loads) + on)
    return out


def build_report(matches: list[Match], unmatched: list[Unmatched], *,
                 sides: tuple[str, str] = ("BASE", "NEW"), level: float, min_effect: float,
                 resamples: int, seed: int, max_load: float | None = rec.MAX_LOAD) -> Report:
    """The comparison Report. frame: one row per matched spec x phase (kind, the spec fields
    that identify it, then phase, base_n, new_n, base_median_ms, new_median_ms, ratio = NEW/BASE,
    ci_low, ci_high, change_pct, verdict); tables: 'throughput and memory' (tokens/s, peak MiB
    per matched spec), 'not compared' (what was not, and why); records: the rows of all three
    as dicts with a 'table' field (for --json). `sides` describe BASE and NEW (a file, a group)."""
    rows, skipped = phase_rows(matches, level=level, min_effect=min_effect,
                               resamples=resamples, seed=seed, max_load=max_load)
    frame = pd.DataFrame(rows)
    all_specs = pd.DataFrame([{k: _scalar(v) for k, v in s.items()}
                              for s in [m.spec for m in matches] + [u.spec for u in unmatched]])
    vary = [c for c in all_specs.columns if all_specs[c].nunique(dropna=False) > 1]
    tables = {}
    if (throughput := pd.DataFrame(throughput_rows(matches))).shape[0]:
        cols = spec_columns(throughput)
        tables["throughput and memory"] = throughput[_varying(throughput, cols)
                                                     + [c for c in throughput.columns if c not in cols]]
    if unmatched or skipped:
        tables["not compared"] = not_compared_frame(unmatched, skipped, vary)
    findings = [f"BASE: {sides[0]}; NEW: {sides[1]}",
                f"NEW/BASE is the ratio of the medians of the raw samples of each phase; the "
                f"interval is a {level:.0%} percentile bootstrap ({resamples} resamples, seed "
                f"{seed}); a phase is 'slower' or 'faster' only when the interval excludes 1 and "
                f"the change exceeds {min_effect:.0%}"]
    if rows:
        n_specs = len(frame[spec_columns(frame)].astype(str).drop_duplicates())
        findings.append(f"{len(rows)} phase(s) of {n_specs} matched spec(s): "
                        f"{counts_sentence(frame['verdict'].tolist())}")
    if rows and (frame["verdict"] == INCONCLUSIVE).any():
        findings.append(f"warning: {(frame['verdict'] == INCONCLUSIVE).sum()} phase(s) changed "
                        f"but are 'inconclusive': a run of one side started with a load above "
                        f"{max_load:g} per CPU, and other processes slow CPU timings down by up "
                        "to several times; re-run on a quiet machine, or interleave BASE and NEW "
                        "runs and give several runs per side")
    if unmatched or skipped:
        findings.append(f"{len(unmatched) + len(skipped)} spec(s) or phase(s) not compared "
                        "(see 'not compared')")
    pooled = sum(len(m.base) > 1 or len(m.new) > 1 for m in matches)
    if pooled:
        findings.append(f"{pooled} spec(s) have several ok records on a side: their samples "
                        "are pooled, and resampled run by run")
    rounds = sum(any(r.get("rounds") for r in m.base + m.new) for m in matches)
    if rounds:
        findings.append(f"{rounds} spec(s) were measured in interleaved rounds (--rounds): "
                        "their samples are resampled round by round")
    findings += _env_findings(matches)
    records = [{"table": "phases", **r} for r in rows]
    for name, df in tables.items():
        records += [{"table": name, **r} for r in df.to_dict(orient="records")]
    return Report(kind="compare", frame=frame, tables=tables, findings=findings,
                  records=[{k: _json_safe(v) for k, v in r.items()} for r in records],
                  title=f"lmperf compare: NEW {sides[1]} vs BASE {sides[0]}",
                  display=make_display(level) if rows else None)


def _json_safe(value: object) -> object:
    """NaN -> None and numpy scalars -> Python ones (Report.render('json') refuses NaN)."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def failing(frame: pd.DataFrame, above_pct: float) -> pd.DataFrame:
    """The rows of a comparison frame that fail `--fail-above above_pct`: verdict 'slower'
    (significant and beyond the minimum effect) and more than `above_pct` percent slower."""
    if frame.empty:
        return frame
    return frame[(frame["verdict"] == SLOWER) & (frame["change_pct"] > above_pct)]
