"""The Report of bench records: the numeric frame, the course's table layout, one-line summaries."""

from __future__ import annotations

import math

import pandas as pd

from lmperf.questions.bench.rounds import latest_view
from lmperf.questions.bench.table import PHASES, display_frame, records_frame
from lmperf.core.report import WIDTH, Report, against

COMPARED = ("precision", "attention", "compile")
"""Sweep axes whose values bench holds against the first one (the question a sweep asks)."""
KEY = ("model", "shape", "context", "batch", "mode", "precision", "attention", "compile",
       "optimizer", "threads", "device", "course", "warmup")


def _display(report: Report):
    return display_frame(report.records)


def build_report(records: list[dict]) -> Report:
    """A Report of bench records: `frame` has one numeric row per run (raw samples stay in the
    records); rendered as text, Markdown or LaTeX it is the course's table (mean ± std per phase,
    failed rows numbered with their reason)."""
    records = latest_view([r for r in records if r["kind"] == "bench"])
    findings = []
    ok = [r for r in records if r["status"] == "ok"]
    frame = records_frame(records)
    tables = {}
    if ok:
        steps = {r["metrics"]["step_ms"]["n"] for r in ok}
        findings.append("times are medians over " + "/".join(map(str, sorted(steps)))
                        + " timed steps per run, the step's mean ± std beside them (raw samples "
                        "in each record)")
        for axis in COMPARED:
            table, lines = ratios(frame, axis)
            if not table.empty:  # its step column is the headline: the table with --details
                tables[f"{axis}: median time against {table['against'].iloc[0]}"] = table
                findings += lines
        pooled = [r for r in ok if r.get("rounds")]
        if pooled:
            spreads = [r["metrics"]["step_ms"]["round_spread"] for r in pooled]
            findings.append(f"{len(pooled)} run(s) pooled over {pooled[0]['rounds']} interleaved "
                            f"rounds (times over all rounds' samples); the step median moved "
                            f"{min(spreads):.1%} to {max(spreads):.1%} between rounds")
    device = (ok or records or [{}])[0].get("env", {}).get("device_name", "")
    ratio_lines = [f for f in findings if " / " in f.split(":")[0]]
    return Report(kind="bench", frame=frame, tables=tables, findings=findings, records=records,
                  title=f"lmperf bench on {device}" if device else "lmperf bench",
                  display=_display, headline=headline(records) + ratio_lines[:3],
                  brief=dict.fromkeys(tables))


def headline(records: list[dict]) -> list[str]:
    """The step times, each run by what tells it apart (size, precision...): one line, or the
    fastest and the slowest where every run's would not fit on one; the runs that failed."""
    shown, _, _ = display_frame(records)
    if shown.empty or "step (ms)" not in shown:
        return []
    label = list(shown.columns[:list(shown.columns).index("status")])
    ok = shown[shown["status"] == "ok"]
    runs = [(" ".join(map(str, row[label])), row["step (ms)"]) for _, row in ok.iterrows()]
    n = {r["metrics"]["step_ms"]["n"] for r in records if r["status"] == "ok"}
    head = f"step time (median of {'/'.join(map(str, sorted(n)))} steps): "
    by: dict[str, list[str]] = {}  # "tiny fp32 72.25, bf16-mixed 62.89 ms; mini ..."
    for name, ms in runs:
        first, _, rest = name.partition(" ")
        by.setdefault(first, []).append(f"{rest} {ms:.4g}".lstrip())
    line = head + "; ".join(f"{first} {', '.join(each)} ms" for first, each in by.items())
    if len(line) > WIDTH:
        (fast, f_ms), (slow, s_ms) = min(runs, key=lambda r: r[1]), max(runs, key=lambda r: r[1])
        line = head + (f"{len(runs)} runs, {fast} fastest ({f_ms:.4g} ms), {slow} slowest "
                       f"({s_ms:.4g} ms)")
    failed = len(shown) - len(ok)
    return ([line] if runs else []) + ([f"{failed} of {len(shown)} runs did not run: see status"]
                                       if failed else [])


def ratios(frame: pd.DataFrame, axis: str) -> tuple[pd.DataFrame, list[str]]:
    """Each value of `axis` against its first value in the sweep, run for run (same model,
    context, batch... otherwise; a run held against the latest such run at or before it: see
    `core.report.against`): (table, findings). Table: one row per value and setting (size,
    context, `axis`, against, then `<phase> (x <first>)`: median / median); findings: one line
    per value, e.g. "bf16-mixed / fp32: 0.49x the step time (median)". Empty where the sweep
    has one value, or no ok run of the first value to hold against."""
    ok = frame[frame["status"] == "ok"].reset_index(drop=True)
    values = list(dict.fromkeys(ok[axis]))
    if len(values) < 2:
        return pd.DataFrame(), []
    first = values[0]
    refs = against(list(ok[[k for k in KEY if k != axis]].itertuples(index=False)),
                   list(ok[axis] == first))
    rows = []
    for (_, run), j in zip(ok.iterrows(), refs):
        if run[axis] == first or j is None:
            continue
        ref = ok.iloc[j]
        row = {"size": run["model"], "context": run["context"], axis: run[axis], "against": first}
        for phase in PHASES:  # a phase the mode does not run has no median: NaN
            a, b = (pd.to_numeric(x[f"{phase}_ms_median"]) for x in (run, ref))
            row[f"{phase} (x {first})"] = a / b if pd.notna(a) and pd.notna(b) and b else math.nan
        rows.append(row)
    table = pd.DataFrame(rows).dropna(axis=1, how="all")
    if table.empty:
        return table, []
    lines = []
    for value, group in table.groupby(axis, sort=False):
        step = group[f"step (x {first})"]
        how = (f"{step.iloc[0]:.2f}x" if len(step) == 1 else
               f"{step.min():.2f}x to {step.max():.2f}x (over {len(step)} settings)")
        lines.append(f"{value} / {first}: {how} the step time (median)")
    return table, lines


def summary_line(record: dict) -> str:
    """One line for a finished run: step time, throughput, or why it did not run."""
    status = record["status"]
    if status != "ok":
        return f"{status}: {record.get('message', '')}"
    m = record["metrics"]
    step = m["step_ms"]
    return (f"step {step['median']:.2f} ms median ({step['mean']:.2f} ± {step['std']:.2f} mean ± std, "
            f"n={step['n']}), {m['tokens_per_s']:,.0f} tokens/s")
