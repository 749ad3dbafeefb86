"""The Report of bench records: the numeric frame, the course's table layout, one-line summaries."""

from __future__ import annotations

import math

import pandas as pd

from lmperf.questions.bench.rounds import latest_view
from lmperf.questions.bench.table import PHASES, display_frame, records_frame
from lmperf.core.report import Report

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
            if not table.empty:
                tables[f"{axis}: median time against {table['against'].iloc[0]}"] = table
                findings += lines
        pooled = [r for r in ok if r.get("rounds")]
        if pooled:
            spreads = [r["metrics"]["step_ms"]["round_spread"] for r in pooled]
            findings.append(f"{len(pooled)} run(s) pooled over {pooled[0]['rounds']} interleaved "
                            f"rounds (times over all rounds' samples); the step median moved "
                            f"{min(spreads):.1%} to {max(spreads):.1%} between rounds")
    device = (ok or records or [{}])[0].get("env", {}).get("device_name", "")
    return Report(kind="bench", frame=frame, tables=tables, findings=findings, records=records,
                  title=f"lmperf bench on {device}" if device else "lmperf bench",
                  display=_display)


def ratios(frame: pd.DataFrame, axis: str) -> tuple[pd.DataFrame, list[str]]:
    """Each value of `axis` against its first value in the sweep, run for run (same model,
    context, batch... otherwise): (table, findings). Table: one row per value and setting
    (size, context, `axis`, against, then `<phase> (x <first>)`: median / median); findings:
    one line per value, e.g. "bf16-mixed / fp32: 0.49x the step time (median)". Empty where
    the sweep has one value, or no ok run of the first value to hold against."""
    ok = frame[frame["status"] == "ok"]
    values = list(dict.fromkeys(ok[axis]))
    if len(values) < 2:
        return pd.DataFrame(), []
    first, key = values[0], [k for k in KEY if k != axis]
    base = ok[ok[axis] == first].set_index(key)
    rows = []
    for _, run in ok[ok[axis] != first].iterrows():
        at = tuple(run[k] for k in key)
        if at not in base.index:
            continue
        ref = base.loc[[at]].iloc[0]
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
