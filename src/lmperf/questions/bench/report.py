"""The Report of bench records: the numeric frame, the course's table layout, one-line summaries."""

from __future__ import annotations

import math

import pandas as pd

from lmperf.questions.bench.rounds import latest_view
from lmperf.questions.bench.table import PHASES, display_frame, records_frame
from lmperf.core.report import Report, against

COMPARED = ("precision", "attention", "compile", "float8")
"""Sweep axes whose values bench holds against the first one (the question a sweep asks)."""
KEY = ("model", "shape", "context", "batch", "mode", "precision", "attention", "compile",
       "optimizer", "threads", "device", "course", "warmup", "checkpoint", "grad_accum",
       "float8")


def _display(report: Report):
    return display_frame(report.records)


def build_report(records: list[dict]) -> Report:
    """A Report of bench records: `frame` has one numeric row per run (raw samples stay in the
    records); rendered as text, Markdown or LaTeX it is the course's table (mean ± std per phase,
    failed rows numbered with their reason)."""
    records = latest_view([r for r in records if r["kind"] == "bench"])
    ok = [r for r in records if r["status"] == "ok"]
    frame = records_frame(records)
    tables, answers, findings = {}, headline(records), []
    for axis in COMPARED if ok else ():  # each value against the first: the answer
        table, lines = ratios(frame, axis)
        if not table.empty:  # its step column is the headline's: the table with --details
            tables[f"{axis}: median time against {table['against'].iloc[0]}"] = table
            answers += lines
    if (pooled := [r for r in ok if r.get("rounds")]):
        spreads = [r["metrics"]["step_ms"]["round_spread"] for r in pooled]
        findings.append(f"{len(pooled)} run(s) pooled over {pooled[0]['rounds']} interleaved "
                        f"rounds (times over all rounds' samples); the step median moved "
                        f"{min(spreads):.1%} to {max(spreads):.1%} between rounds")
    device = (ok or records or [{}])[0].get("env", {}).get("device_name", "")
    return Report(kind="bench", frame=frame, tables=tables, findings=findings, records=records,
                  title=f"lmperf bench on {device}" if device else "lmperf bench",
                  display=_display, headline=answers, brief=dict.fromkeys(tables))


def headline(records: list[dict]) -> list[str]:
    """The median step of every run by what tells the runs apart, sizes grouped ("tiny fp32
    72.25, bf16-mixed 62.89 ms; mini ..."; beyond 6 runs the fastest and the slowest), and how
    many runs did not run."""
    shown, _, _ = display_frame(records)
    if "step (ms)" not in shown:
        return []
    axes = [c for c in list(shown.columns)[:list(shown.columns).index("status")] if c != "shape"]
    ok = shown[shown["status"] == "ok"]
    runs = [(" ".join(str(v) if c in ("size", "precision") else f"{c} {v}" for c, v in row.items()),
             step) for row, step in zip(ok[axes].to_dict("records"), ok["step (ms)"])]
    by: dict[str, list[str]] = {}
    for name, step in runs:
        size, _, rest = name.partition(" ")
        by.setdefault(size, []).append(f"{rest} {step:.4g}".lstrip())
    (fast, f), (slow, s) = min(runs, key=lambda r: r[1], default=("", 0)), max(
        runs, key=lambda r: r[1], default=("", 0))
    n = sorted({r["metrics"]["step_ms"]["n"] for r in records if r["status"] == "ok"})
    failed = len(shown) - len(ok)
    return ([f"step time (median of {'/'.join(map(str, n))} steps): " + (
        "; ".join(f"{size} {', '.join(each)} ms" for size, each in by.items()) if len(runs) <= 6
        else f"{len(runs)} runs, fastest {fast} {f:.4g} ms, slowest {slow} {s:.4g} ms")]
        if runs else []) + ([f"{failed} of {len(shown)} runs did not run: see status"]
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
    # never across runs of the command: a sweep's own first value only (older records: any)
    refs = against(list(ok[[k for k in KEY if k != axis] + ["sweep"]].itertuples(index=False)),
                   list(ok[axis] == first))
    shown = [k for k in KEY[2:] if k != axis and ok[k].nunique(dropna=False) > 1]
    rows = []
    for (_, run), j in zip(ok.iterrows(), refs):
        if run[axis] == first or j is None:
            continue
        ref = ok.iloc[j]
        row = {"size": run["model"], "context": run["context"],
               **{k: run[k] for k in shown if k != "context"}, axis: run[axis], "against": first}
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
