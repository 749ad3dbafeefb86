"""The Report of a comparison: the phases frame (numeric), the 'throughput and memory' and 'not
compared' tables, findings (method, counts, load, environment), and the layout for reading."""

from __future__ import annotations

import math
from typing import Callable, Sequence

import pandas as pd

from lmperf.questions.compare import records as rec
from lmperf.questions.compare.match import Match, Unmatched, differ_finding
from lmperf.questions.compare.rows import (CPU, STAT_COLUMNS, THROUGHPUT_COLUMNS, cell,
                                           judged_change, not_compared_rows, phase_rows,
                                           throughput_rows)
from lmperf.core.report import Report, caption_axes
from lmperf.measure.compare import (FASTER, INCONCLUSIVE, LOADED_MIN_EFFECT, SAME, SLOWER,
                                    SPREAD_FACTOR, TOO_FEW)

# Spec fields that follow from the others shown (a preset's shape follows from its size): left
# out of the displayed table when they add nothing, kept in the frame.
DERIVED = ("d_model", "num_layers", "num_heads", "d_ff", "model_context")


def spec_columns(df: pd.DataFrame) -> list[str]:
    """The identity columns of a comparison table (record kind and spec fields)."""
    numbers = set(STAT_COLUMNS) | set(THROUGHPUT_COLUMNS)
    return [c for c in df.columns if c not in numbers]


def shown_columns(df: pd.DataFrame, columns: Sequence[str]) -> list[str]:
    """The identity columns worth a column when reading: those that vary across the rows (a
    derived shape field only when the others shown do not already determine it)."""
    axes, _ = caption_axes(df, [(c, c) for c in columns])
    varying = [c for c, _ in axes]
    shown = [c for c in varying if c not in DERIVED]
    for c in varying:
        if c in DERIVED and shown:
            if df.groupby(shown, dropna=False)[c].nunique(dropna=False).max() > 1:
                shown.append(c)
    return [c for c in columns if c in shown]


def spec_label(row: pd.Series, columns: Sequence[str]) -> str:
    """'size=tiny context=64' from the given columns of one row (missing ones skipped)."""
    return " ".join(f"{c}={row[c]}" for c in columns
                    if not (isinstance(row[c], float) and math.isnan(row[c])))


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def make_display(level: float) -> Callable[[Report], tuple[pd.DataFrame, str, list[str]]]:
    """The phases table for reading: the identity fields that vary, the phase, the medians,
    'ratio [low, high]', the change in percent and the verdict (plus each side's load per CPU
    when a verdict is 'inconclusive'); fields that hold one value go to the caption."""

    def display(report: Report) -> tuple[pd.DataFrame, str, list[str]]:
        df = report.frame
        columns = spec_columns(df)
        shown = shown_columns(df, columns)
        _, caption = caption_axes(df, [(c, c) for c in columns if c not in shown])
        out = df[shown].copy()
        out["phase"] = df["phase"]
        out["base (ms)"] = [_fmt(x, ".2f") for x in df["base_median_ms"]]
        out["new (ms)"] = [_fmt(x, ".2f") for x in df["new_median_ms"]]
        # Wall time, then CPU time beside it when there is any, whichever clock was judged.
        clocks = [("", "")] + ([("cpu_", "CPU ")] if df["cpu_ratio"].notna().any() else [])
        for clock, label in clocks:  # column prefix in the frame, label prefix in the table
            out[f"{label}NEW/BASE [{level:.0%} CI]"] = [
                f"{_fmt(r, '.3f')} [{_fmt(lo, '.3f')}, {_fmt(hi, '.3f')}]"
                for r, lo, hi in zip(df[f"{clock}ratio"], df[f"{clock}ci_low"],
                                     df[f"{clock}ci_high"])]
            out[f"{label}change"] = [_fmt(x, "+.1f") + ("%" if x == x else "")
                                     for x in df[f"{clock}change_pct"]]
        # loaded, one run on a side: marked, with the widened minimum effect in the caption
        wide = df["min_effect_from"].notna()
        out["verdict"] = [v + "*" * w for v, w in zip(df["verdict"], wide)]
        if wide.any():
            caption = "; ".join(p for p in (caption, "* judged with a widened minimum effect "
                                "(loaded, one run per side): " + ", ".join(
                                    f"{p} {m:.0f}% ({why})" for p, m, why in zip(
                                        df["phase"][wide], df["min_effect_pct"][wide],
                                        df["min_effect_from"][wide]))) if p)
        if (df["judged_on"] == CPU).any():
            out["judged on"] = df["judged_on"]
        if (df["verdict"] == INCONCLUSIVE).any() or (df["judged_on"] == CPU).any():
            out["load/CPU"] = [f"{_fmt(b, '.2f')} / {_fmt(n, '.2f')}"
                               for b, n in zip(df["base_load_per_cpu"], df["new_load_per_cpu"])]
            out["off-CPU"] = [f"{_fmt(b, '.0%')} / {_fmt(n, '.0%')}"
                              for b, n in zip(df["base_off_cpu"], df["new_off_cpu"])]
        return out, "; ".join(p for p in (caption, "medians of the raw samples") if p), []

    return display


def counts_sentence(verdicts: Sequence[str]) -> str:
    """'2 slower, 1 faster, 29 no significant change' (only the verdicts present)."""
    counts = [(sum(v == name for v in verdicts), name)
              for name in (SLOWER, FASTER, SAME, INCONCLUSIVE, TOO_FEW)]
    return ", ".join(f"{n} {name}" for n, name in counts if n)


def _short(value: object) -> str:
    """An environment value for a sentence: a git commit by its first 10 characters."""
    text = str(value)
    head, dirty = (text[:-6], "-dirty") if text.endswith("-dirty") else (text, "")
    is_commit = len(head) == 40 and all(c in "0123456789abcdef" for c in head)
    return head[:10] + dirty if is_commit else text


def _env_findings(matches: list[Match]) -> list[str]:
    """A warning per environment field that differs between the sides, the code versions when
    they differ, and the load when the runs started."""
    out = []
    for fields, warn in ((rec.ENV_FIELDS, True), (rec.VERSION_FIELDS, False)):
        differ: dict[str, tuple[set, set]] = {}
        for m in matches:
            for f in fields:
                b = {_short(e[f]) for r in m.base if f in (e := rec.env_values(r, fields))}
                n = {_short(e[f]) for r in m.new if f in (e := rec.env_values(r, fields))}
                if b and n and b != n:
                    seen = differ.setdefault(f, (set(), set()))
                    seen[0].update(b)
                    seen[1].update(n)
        for f, (b, n) in differ.items():
            text = f"{f} {'/'.join(sorted(b))} (BASE) vs {'/'.join(sorted(n))} (NEW)"
            out.append(f"warning: the environment differs, {text}: the ratios include that "
                       "difference" if warn else f"code: {text}")
    loads, cpus = [], set()
    for label, side in (("BASE", "base"), ("NEW", "new")):
        records = [r for m in matches for r in getattr(m, side)]
        values = [x for r in records if (x := rec.load_average(r)) is not None]
        cpus |= {c for r in records if isinstance(c := (r.get("env") or {}).get("cpu_count"), int)}
        if values:
            top = f"-{max(values):.2f}" if max(values) > min(values) else ""
            loads.append(f"{label} {min(values):.2f}{top}")
    if loads:
        on = f" ({'/'.join(map(str, sorted(cpus)))} CPUs)" if cpus else ""
        out.append("1-minute load average when the runs started: " + ", ".join(loads) + on)
    return out


# (phases column, value) -> the finding when some phases hold that value: {n} is how many,
# {loaded} why a side counts as loaded.
_PHASE_NOTES = {
    ("min_effect_from", "widened"): (
        "{n} phase(s) of one run per side on a loaded machine ({loaded}) judged with a wider "
        "minimum effect (marked *): the largest of --min-effect, "
        f"{LOADED_MIN_EFFECT:.0%} ('load': the most a phase of separate same-spec runs moved "
        f"under load, with margin: docs/accuracy.md) and {SPREAD_FACTOR:g} x the runs' own "
        "IQR/median of the phase ('spread'); a change below it is 'inconclusive': loaded, use an A/B sweep with --rounds "
        "(bench --model A B --rounds 3, then compare --by model), whose intervals see the load"),
    ("judged_on", CPU): (
        "{n} phase(s) judged on CPU time, not wall time: {loaded}. Other processes steal wall "
        "time from a step but not the CPU time of its measuring thread (time.thread_time); they "
        "can still slow it through shared caches and memory bandwidth (false-alarm and detection "
        "rates under load: docs/accuracy.md). Both are shown"),
    ("verdict", INCONCLUSIVE): (
        "warning: {n} phase(s) changed but are 'inconclusive' (not counted by --fail-above): "
        "{loaded}, and the change is below the widened minimum effect, or there is no CPU time "
        "of the measuring thread to judge on (CUDA, several torch threads, older records); "
        "re-run on a quiet machine, or as an A/B sweep with --rounds (README)"),
}


def _findings(frame: pd.DataFrame, matches: list[Match], not_compared: int,
              hint: str | None, *, sides: tuple[str, str], level: float, min_effect: float,
              resamples: int, seed: int, max_load: float | None) -> list[str]:
    out = [f"BASE: {sides[0]}; NEW: {sides[1]}",
           f"NEW/BASE is the ratio of the medians of the raw samples of each phase; the interval "
           f"is a {level:.0%} percentile bootstrap ({resamples} resamples, seed {seed}); a phase "
           f"is 'slower' or 'faster' only when the interval excludes 1 and the change exceeds "
           f"{min_effect:.0%}"]
    if not frame.empty:  # (how many phases got which verdict: the headline)
        loaded = (f"a CPU run of one side started with a load above {max_load:g} per CPU or "
                  f"spent more than {rec.MAX_OFF_CPU:.0%} of its step off the CPU"
                  if max_load is not None else "")
        for (column, value), sentence in _PHASE_NOTES.items():
            hit = frame[column].notna() if value == "widened" else frame[column] == value
            if n := int(hit.sum()):
                out.append(sentence.format(n=n, loaded=loaded))
    if not_compared:
        out.append(f"{not_compared} spec(s) or phase(s) not compared (see 'not compared')")
    if hint:
        out.append(hint)
    if pooled := sum(len(m.base) > 1 or len(m.new) > 1 for m in matches):
        out.append(f"{pooled} spec(s) have several ok records on a side: their samples are "
                   "pooled, and resampled run by run")
    if rounds := sum(any(r.get("rounds") for r in m.base + m.new) for m in matches):
        out.append(f"{rounds} spec(s) were measured in interleaved rounds (--rounds): their "
                   "samples are resampled round by round")
    return out + _env_findings(matches)


def headline(frame: pd.DataFrame, sides: tuple[str, str], specs: int) -> list[str]:
    """The answer: NEW against BASE on the step (or the first phase compared), the ratio of
    medians with its interval and verdict for one spec, their range for several, then the
    verdicts' counts; or that nothing was compared."""
    if frame.empty:
        return [f"nothing compared: none of {specs} spec(s) ran ok on both sides "
                f"(NEW {sides[1]}, BASE {sides[0]}; see 'not compared')"]
    phase = "step" if (frame["phase"] == "step").any() else frame["phase"].iloc[0]
    rows = frame[frame["phase"] == phase]
    judged = [judged_change(row) for _, row in rows.iterrows()]
    if len(judged) == 1:
        _, ratio, low, high = judged[0]
        said = (f"{phase} time {ratio:.3f}x BASE's [{low:.3f}, {high:.3f}], "
                f"{rows['verdict'].iloc[0]}")
    else:
        ratios = [r for _, r, _, _ in judged]
        said = (f"{phase} time {min(ratios):.3f}x to {max(ratios):.3f}x BASE's over "
                f"{len(judged)} specs ({counts_sentence(rows['verdict'].tolist())})")
    return [f"NEW {sides[1]} vs BASE {sides[0]}: {said}; all {len(frame)} phase(s) compared: "
            f"{counts_sentence(frame['verdict'].tolist())}"]


def _json_safe(value: object) -> object:
    """NaN -> None and numpy scalars -> Python ones (Report.render('json') refuses NaN)."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def build_report(matches: list[Match], unmatched: list[Unmatched], *,
                 sides: tuple[str, str] = ("BASE", "NEW"), level: float, min_effect: float,
                 resamples: int, seed: int, max_load: float | None = rec.MAX_LOAD) -> Report:
    """The comparison Report: `frame` one row per matched spec x phase (record_kind, the spec
    fields that identify it, then STAT_COLUMNS; each is described in docs/commands/compare.md),
    `tables` 'throughput and memory' (tokens/s, peak MiB) and 'not compared', `records` the rows
    of all three with kind 'compare' and a 'table' field (--json). `sides` name BASE and NEW."""
    rows, skipped = phase_rows(matches, level=level, min_effect=min_effect,
                               resamples=resamples, seed=seed, max_load=max_load)
    frame = pd.DataFrame(rows)
    specs = pd.DataFrame([{k: cell(v) for k, v in s.items()}
                          for s in [m.spec for m in matches] + [u.spec for u in unmatched]])
    varying = [c for c in specs.columns if specs[c].nunique(dropna=False) > 1]
    tables = {}
    if not (throughput := pd.DataFrame(throughput_rows(matches))).empty:
        ids = spec_columns(throughput)
        # a figure no record of either side has (tokens/s of attention records) is left out
        rest = [c for c in throughput.columns if c not in ids and throughput[c].notna().any()]
        tables["throughput and memory"] = throughput[shown_columns(throughput, ids) + rest]
    if unmatched or skipped:
        tables["not compared"] = pd.DataFrame(not_compared_rows(unmatched, skipped, varying))
    findings = _findings(frame, matches, len(unmatched) + len(skipped), differ_finding(unmatched),
                         sides=sides, level=level, min_effect=min_effect, resamples=resamples,
                         seed=seed, max_load=max_load)
    records = [{"kind": "compare", "table": "phases", **r} for r in rows]
    for name, df in tables.items():
        records += [{"kind": "compare", "table": name, **r} for r in df.to_dict(orient="records")]
    return Report(kind="compare", frame=frame, tables=tables, findings=findings,
                  records=[{k: _json_safe(v) for k, v in r.items()} for r in records],
                  title=f"lmperf compare: NEW {sides[1]} vs BASE {sides[0]}",
                  display=make_display(level) if rows else None,
                  headline=headline(frame, sides, len(matches) + len(unmatched)),
                  answer=("change", "verdict"))


def failing(frame: pd.DataFrame, above_pct: float) -> pd.DataFrame:
    """The rows of a comparison frame that fail `--fail-above above_pct`: verdict 'slower'
    (significant and beyond the minimum effect) and more than `above_pct` percent slower, on
    the clock the verdict was judged on (`judged_on`)."""
    if frame.empty:
        return frame
    change = pd.Series([judged_change(row)[0] for _, row in frame.iterrows()], index=frame.index)
    return frame[(frame["verdict"] == SLOWER) & (change > above_pct)]
