"""A profile's record for the results file, the Report rebuilt from records alone (for
`lmperf profile`, `lmperf.profile(...)` and `lmperf table`), and its tables as CSV files."""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path
from typing import Mapping

import pandas as pd

from lmperf.core.report import Report, caption_axes, median_columns, numbered, plural, status_notes
from lmperf.errors import LmperfError
from lmperf.measure.stats import summarize
from lmperf.results.record import stored_table

KIND = "profile"
PHASES: tuple[str, ...] = ("forward", "backward", "optimizer", "step")
# The phase-times table's title (also the key its rows are stored under in a record).
PHASE_TIMES = "phase times: benchmarked vs profiled (ms per step, mean ± std)"
WAITS_STEP = "where the step waits: per profiled step (ms; idle and host wait: shares of the span)"
WAITS_PHASE = "where the step waits: per phase (ms per profiled step, mean)"
CATEGORIES = "share of each phase by category"
# Spec fields shown in the caption when every row has the same value.
CAPTION_FIELDS: tuple[tuple[str, str], ...] = (
    ("warmup", "warmup"), ("steps", "steps"), ("optimizer", "optimizer"), ("threads", "threads"),
    ("device", "device"))
BRIEF: tuple[tuple[str, tuple[str, ...] | None, int | None], ...] = (
    # (title starts with, columns shown in text (None: all), rows): one screen by default
    ("top operators (self time): step", ("name", "category", "calls_per_step", "ms_per_step",
                                         "avg_us", "share"), 5),
    ("top kernels: step", ("name", "category", "calls_per_step", "ms_per_step", "avg_us",
                           "share"), 5),
    (WAITS_PHASE, ("phase", "gpu_span_ms", "gpu_busy_ms", "gpu_idle_ms", "gpu_host_wait_ms",
                   "bound", "cpu_range_ms"), None),
    ("roofline per phase", ("phase", "measured_ms", "ideal_ms", "compute_ms", "memory_ms",
                            "measured_over_ideal", "overhead_bound_ms"), None),
    (CATEGORIES, None, 5),
    # with --details only (rows 0), in these columns
    (PHASE_TIMES, ("phase", "benchmarked_ms_mean", "benchmarked_ms_std", "profiled_ms_mean",
                   "trace_range_ms_mean", "overhead_pct"), 0),
    ("top ", ("name", "category", "calls_per_step", "ms_per_step", "avg_us", "share"), 0),
    ("attention:", ("range", "calls_per_step", "ms_per_step", "share", "flops_per_step_analytic",
                    "flop_analytic_share"), 0),
    ("roofline per operator", ("phase", "op", "calls", "measured_ms", "ideal_ms",
                               "measured_over_ideal", "bound"), 0),
)
"""What `lmperf profile` prints of each table by default (text); every other table (the phase
times against the benchmark, each phase's top entries, attention, the ceilings, the roofline's
operators) with --details and in the full formats."""


def build_report(records: list[dict]) -> Report:
    """The Report of profile records.

    frame: one numeric row per record (spec fields, status, message, per-phase ms: benchmarked
    mean and std, and the mean under the profiler; the profiling cost in seconds); tables: the
    tables each record stored (titles prefixed with the run's label when there are several
    records); findings: the stored notes (prefixed likewise).
    """
    records = [r for r in records if r.get("kind") == KIND]
    several = len(records) > 1
    tables: dict[str, pd.DataFrame] = {}
    findings: list[str] = []
    for record, label in zip(records, _labels(records)):
        metrics = record.get("metrics") or {}
        prefix = f"{label}: " if several else ""
        for title, rows in (metrics.get("tables") or {}).items():
            tables[prefix + title] = stored_table(title, rows)
            if title.startswith("roofline per operator") and "measured_ms" in tables[prefix + title]:
                tables[prefix + title] = tables[prefix + title].sort_values(
                    "measured_ms", ascending=False, kind="stable").reset_index(drop=True)
        findings += [prefix + note for note in metrics.get("notes") or []]
    ok = [r for r in records if r["status"] == "ok"]
    device = (ok or records or [{}])[0].get("env", {}).get("device_name", "")
    frame = pd.DataFrame([_row(r) for r in records])
    if not frame.empty:  # a failed row has no params: keep the column integer, not float
        frame["params"] = frame["params"].astype("Int64")
    brief: dict = {}
    for name in tables:
        title = name.split(": ", 1)[1] if several and ": " in name else name
        brief[name] = next(((columns, rows) for start, columns, rows in BRIEF
                            if title.startswith(start)), None)
    if any(name.endswith(WAITS_PHASE) for name in tables):  # a GPU run: its waits take the room
        brief.update({name: (None, 0) for name in tables if name.endswith(CATEGORIES)})
    headline = (_headline(frame.iloc[0], tables, findings) if len(ok) == 1 and len(records) == 1
                else [f"{label}: " + ((r.get("metrics") or {}).get("notes") or
                                      [f"{r['status']}: {r.get('message', '')}"])[0]
                      for r, label in zip(records, _labels(records))][:4])
    more = [f for f in findings if f.startswith(MORE) or f.split(": ", 1)[-1].startswith(MORE)]
    return Report(kind=KIND, frame=frame, tables=tables,
                  findings=[f for f in findings if f not in more and f not in headline],
                  records=records, more=more,
                  title=f"lmperf profile on {device}" if device else "lmperf profile",
                  display=_display, brief=brief, headline=headline)


MORE = ("Profiling cost", "Roofline method", "Profiler overhead within", "Roofline: the ",
        "No GPU in this run")
"""Findings for --details (and the full formats): the method, the cost, what the headline says."""


def top_line(tables: Mapping[str, pd.DataFrame]) -> str | None:
    """'top of the step: NAME 59.7% (87 calls per step); by category: matmul 64.3%, ...': the
    step's largest entry (kernel on a GPU, operator on a CPU) and its three largest categories."""
    top = tables.get("top kernels: step", tables.get("top operators (self time): step"))
    if top is None or top.empty:
        return None
    first = top.iloc[0]
    line = (f"top of the step: {first['name']} {first['share']:.1%} "
            f"({plural(first['calls_per_step'], 'call')} per step)")
    cats = tables.get("share of each phase by category")
    if cats is not None and "step" in cats:
        big = cats.sort_values("step", ascending=False).head(3)
        line += "; by category: " + ", ".join(f"{c} {v:.1%}" for c, v in zip(big["category"],
                                                                             big["step"]))
    return line


def _headline(row: pd.Series, tables: Mapping[str, pd.DataFrame], notes: list[str]) -> list[str]:
    """What bounds the step and its top share, in up to four lines: the device's waits (a GPU
    run's first note) or the step against its roofline ideal (a CPU run: the host's), the top
    entry and categories, the op furthest above its roofline, the profiler's overhead."""
    out = [n for n in notes[:1] if n.split(":")[0] in ("host-bound", "device-bound",
                                                         "GPU idle with its work queued")]
    roof = next((df for name, df in tables.items() if name.startswith("roofline per phase")),
                None)
    step = roof[roof["phase"] == "step"] if roof is not None else pd.DataFrame()
    if not out:
        host = "; the host's: no GPU" if row.get("device") == "cpu" else ""
        line = f"step {row['step_ms_median']:.4g} ms (median of {row['steps']}{host})"
        if not step.empty:
            s = step.iloc[0]
            line += (f", {row['step_ms_median'] / s['ideal_ms']:.1f}x its roofline ideal of "
                     f"{s['ideal_ms']:.4g} ms (compute {s['compute_ms']:.4g}, memory "
                     f"{s['memory_ms']:.4g})")
        out.append(line)
    out += [x for x in [top_line(tables)] if x]
    out += [re.sub(r"^Roofline: the op furthest above its ideal is (.*) ms vs (.*)\.$",
                   r"furthest above its roofline: \1 vs \2", n)
            for n in notes if n.startswith("Roofline: the op")][:1]
    b, p = row["step_ms_mean"], row["step_profiled_ms_mean"]
    if not (math.isnan(b) or math.isnan(p)):
        noise = " (within noise)" if row["step_overhead_noise"] == True else ""  # noqa: E712
        out.append(f"profiler overhead on the step: {p / b - 1:+.1%}{noise}")
    return out[:4]


def _label(spec: Mapping) -> str:
    name = spec.get("model") or spec.get("size") or "?"
    return (f"{name} ctx={spec.get('context')} b={spec.get('batch')} "
            f"{spec.get('precision')} {spec.get('mode')} {spec.get('attention')}")


def _labels(records: list[dict]) -> list[str]:
    """The run label of each record, numbered when two records share one."""
    return numbered([_label(r.get("spec") or {}) for r in records])


def overhead_within_noise(benchmarked: list[float], profiled: list[float]) -> bool | None:
    """Whether the profiler's overhead on a phase (mean profiled / mean benchmarked - 1) is
    within the run-to-run noise: the difference of the two means is within two standard errors
    of a difference of means (Welch, sqrt(s1^2/n1 + s2^2/n2), ~95% for normal samples), so a
    "-8.2%" from 10 noisy steps is not read as the profiler speeding the model up. None when
    either side has fewer than two samples (no spread to judge by)."""
    if len(benchmarked) < 2 or len(profiled) < 2:
        return None
    se = math.sqrt(statistics.variance(benchmarked) / len(benchmarked)
                   + statistics.variance(profiled) / len(profiled))
    return abs(statistics.fmean(profiled) - statistics.fmean(benchmarked)) <= 2 * se


def _phase_stats(metrics: dict) -> dict[str, tuple[float, float, float, float]]:
    """phase -> (benchmarked mean, benchmarked std, profiled mean, benchmarked median) in ms
    per step: from the raw samples, or (records without them, written before schema 2) from
    the stored phase-times table (no median there: NaN)."""
    samples = metrics.get("samples_ms") or {}
    out = {}
    if samples:
        for phase, xs in (samples.get("benchmarked") or {}).items():
            prof = (samples.get("profiled") or {}).get(phase) or []
            s = summarize(xs) if xs else {"mean": math.nan, "std": 0.0, "median": math.nan}
            out[phase] = (s["mean"], s["std"], statistics.fmean(prof) if prof else math.nan,
                          s["median"])
        return out
    rows = (metrics.get("tables") or {}).get(PHASE_TIMES)
    if rows:
        df = stored_table(PHASE_TIMES, rows)
        for r in df.to_dict(orient="records"):
            out[r["phase"]] = tuple(float(r.get(c, math.nan)) for c in (
                "benchmarked_ms_mean", "benchmarked_ms_std", "profiled_ms_mean")) + (math.nan,)
    return out


def _row(record: dict) -> dict:
    spec, metrics = record.get("spec") or {}, record.get("metrics") or {}
    row: dict = {
        "model": spec.get("model") or spec.get("size"),
        "shape": (f"d={spec.get('d_model')} L={spec.get('num_layers')} "
                  f"H={spec.get('num_heads')} ff={spec.get('d_ff')}"),
        "params": record.get("params"), "context": spec.get("context"),
        "batch": spec.get("batch"), "precision": spec.get("precision"),
        "mode": spec.get("mode"), "attention": spec.get("attention"),
        "warmup": spec.get("warmup"), "steps": spec.get("steps"),
        "optimizer": spec.get("optimizer"), "threads": spec.get("threads", 0),
        "device": spec.get("device"),
        "status": record["status"], "message": record.get("message", ""),
    }
    stats = _phase_stats(metrics)
    for phase in PHASES:
        mean, std, profiled, median = stats.get(phase, (math.nan,) * 4)
        row[f"{phase}_ms_mean"], row[f"{phase}_ms_std"] = mean, std
        row[f"{phase}_ms_median"] = median
        row[f"{phase}_profiled_ms_mean"] = profiled
        samples = metrics.get("samples_ms") or {}
        row[f"{phase}_overhead_noise"] = overhead_within_noise(
            (samples.get("benchmarked") or {}).get(phase) or [],
            (samples.get("profiled") or {}).get(phase) or [])
    timings = metrics.get("timings_s") or {}
    for name in ("profiled_steps_s", "capture_s", "trace_export_s", "trace_parse_s", "analysis_s"):
        row[name] = timings.get(name, math.nan)
    env = record.get("env") or {}
    row.update(trace_path=metrics.get("trace_path"), device_name=env.get("device_name"),
               timestamp=env.get("timestamp"))
    return row


def _display(report: Report) -> tuple[pd.DataFrame, str, list[str]]:
    """The frame for reading: the run, status, the median per phase with the step's mean ± std
    beside it, profiler overhead (means: a difference of means, judged against the noise)."""
    df = report.frame
    run = [("model", "size"), ("context", "context"), ("batch", "batch"),
           ("precision", "precision"), ("mode", "mode"), ("attention", "attention")]
    if any((r.get("spec") or {}).get("model") for r in report.records):
        run.insert(1, ("shape", "shape"))  # a user's model: the shape its factory received
    varying, caption = caption_axes(df, run[:1] + run[1:] + list(CAPTION_FIELDS))
    out = pd.DataFrame(index=df.index)
    for col, title in varying:
        out[title] = df[col]
    out["status"], notes = status_notes(df["status"], df["message"])
    median_columns(out, df, PHASES)
    if df["step_profiled_ms_mean"].notna().any():
        # Percent at render only; "(noise)" where the difference is within the run's spread.
        out["profiler overhead"] = [
            "-" if math.isnan(p) or math.isnan(b) else
            f"{p / b - 1:+.1%}" + (" (noise)" if noise is True else "")
            for p, b, noise in zip(df["step_profiled_ms_mean"], df["step_ms_mean"],
                                   df["step_overhead_noise"])]
    return out, caption, notes


def write_csv(tables: Mapping[str, pd.DataFrame], folder: Path) -> list[Path]:
    """One CSV per table in `folder`, named after the table's title; returns the paths."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        paths = []
        for title, df in tables.items():
            path = folder / (re.sub(r"[^A-Za-z0-9]+", "_", title).strip("_")[:80] + ".csv")
            df.to_csv(path, index=False)
            paths.append(path)
    except OSError as exc:
        raise LmperfError(f"cannot write CSV tables to {folder}: {exc.strerror or exc}") from None
    return paths
