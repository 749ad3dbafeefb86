"""`lmperf profile --from-trace FILE`: the tables of a profile for a trace the user already has.

Any torch.profiler Chrome trace (.json or .json.gz, CPU-only or CUDA) is parsed once
(`trace.load_trace`); the Report holds a profile run's tables. No record is appended: a record's
spec is the identity of a run lmperf made (what `--resume` and `lmperf table` key on) and a
foreign trace has none; everything here is a pure function of the file, rerun at will.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import pandas as pd

from lmperf.core.report import Report, plural
from lmperf.errors import SpecError, TraceFormatError
from lmperf.questions.profile import overlap, views
from lmperf.questions.profile.range_names import STEP
from lmperf.questions.profile.classify import classify, short_name
from lmperf.questions.profile.gemm import describe_gemm
from lmperf.questions.profile.report import KIND, top_line
from lmperf.questions.profile.trace import PHASE_LABELS, UNATTRIBUTED, Trace, load_trace

PHASE_TABLE = "time per phase (ms per step, mean over the steps)"
CATEGORY_TABLE = "share of each phase by category"


def analyse_trace(path: str | Path, top: int = 10) -> Report:
    """The Report of an existing torch.profiler trace (see the module docstring).

    frame: one row per step (step, profiler_step, cpu_ms, and on a GPU trace gpu_span_ms,
    gpu_busy_ms, gpu_kernel_ms, gpu_idle_share, gpu_activities); tables: time per phase, top
    kernels (GPU) and top operators (self time) per phase, categories; findings: what the trace
    lacks, in one line each, and what the numbers say. Raises TraceFormatError for a missing or
    corrupt file or a directory, SpecError for `top` < 1.
    """
    if top < 1:
        raise SpecError(f"--top must be a positive integer, got {top}")
    path = Path(path)
    if path.is_dir():
        raise TraceFormatError("--from-trace reads one trace file; for a folder of per-rank "
                               f"traces use HTA: TraceAnalysis(trace_dir={str(path)!r})")
    if not path.is_file():
        raise TraceFormatError(f"no trace file at {path}")
    start = time.perf_counter()
    trace = load_trace(path)
    parse_s = time.perf_counter() - start
    notes: list[str] = []
    if trace.n_steps == 0:
        notes.append(f"No ProfilerStep#N (or `step`) ranges in {path.name}: the whole trace is "
                     "analysed as one step.")
        trace = as_one_step(trace)
    gpu = trace.device_type == "cuda"
    if not gpu:
        notes.append(f"No GPU activity (kernels, memcpys, memsets) in {path.name}: CPU operator "
                     "tables only.")
    phases = present_phases(trace)
    if not phases:
        notes.append("No phase annotations (forward/backward/optimizer ranges, autograd nodes, "
                     "Optimizer.step#, module forwards): per-step totals only.")
    tables: dict[str, pd.DataFrame] = {}
    per_step = step_table(trace)
    tables[PHASE_TABLE] = phase_times(trace, phases)
    for phase in phases + [STEP]:
        if gpu:
            tables[f"top kernels: {phase}"] = kernel_table(trace, phase, top)
        tables[f"top operators (self time): {phase}"] = views.phase_table(
            trace, phase, top=top, classify=classify, kind="ops")
    tables[CATEGORY_TABLE] = category_table(trace, phases + [STEP])
    headline = [line for line in [waits_headline(per_step), top_line(tables)] if line]
    findings = notes + _findings(trace, per_step, tables, phases, gpu)
    findings.append(f"Parsed {path.name} in {parse_s:.2f} s ({len(trace.ops)} operators, "
                    f"{len(trace.kernels)} device activities); no record written (a trace "
                    "analysis is rerun from its file).")
    device = ", ".join(dict.fromkeys(trace.device_names))
    title = f"lmperf profile --from-trace {path.name}" + (f" (recorded on {device})" if device else "")
    # the screen: the step's top entries, the phases and categories; the rest with --details
    brief = {name: (("name", "category", "calls_per_step", "ms_per_step", "share", "gemm"), 5)
             if name.endswith(f": {STEP}") else None for name in tables if name.startswith("top ")}
    return Report(kind=KIND, frame=per_step, tables=tables, findings=findings, records=[],
                  title=title, brief=brief, headline=headline)


def kernel_table(trace: Trace, phase: str, top: int | None = 10) -> pd.DataFrame:
    """`views.phase_table` of the device activities of `phase`, with each GEMM's name decoded
    (`gemm`) and names shortened for reading (`classify.short_name`; categories and GEMM fields
    are read from the full names, which `views.phase_table` keeps)."""
    df = views.phase_table(trace, phase, top=top, classify=classify, kind="kernels")
    df["gemm"] = [describe_gemm(n) or "" for n in df["name"]]
    df["name"] = [short_name(n) for n in df["name"]]
    return df


def present_phases(trace: Trace) -> list[str]:
    """The phases (of PHASE_LABELS, in order) that some operator or kernel of `trace` is in."""
    return [p for p in PHASE_LABELS if _present(trace, p)]


def _present(trace: Trace, phase: str) -> bool:
    return bool((trace.ops["phase_range" if phase == "loss" else "phase"] == phase).any() or (
        len(trace.kernels) and (trace.kernels["phase_range" if phase == "loss" else "phase"]
                                == phase).any()))


def as_one_step(trace: Trace) -> Trace:
    """The trace with everything in it as measured step 0 (for a trace with no step ranges);
    device activities without a launch stay outside."""
    ops = trace.ops.assign(step=0, in_step=True)
    k = trace.kernels
    found = (k["phase"] != UNATTRIBUTED).to_numpy() if len(k) else np.zeros(0, bool)
    kernels = k.assign(step=np.where(found, 0, -1), in_step=found)
    ranges = trace.ranges.assign(step=0)
    return dataclasses.replace(trace, ops=ops, kernels=kernels, ranges=ranges, n_steps=1)


def step_table(trace: Trace) -> pd.DataFrame:
    """One row per measured step: step, profiler_step (its ProfilerStep#N), cpu_ms (the host
    range of the step), and on a GPU trace (`overlap.breakdown`) the device's span and busy
    time (ms), gpu_idle_share and gpu_host_wait_share (fractions of the span: rendered as
    percent), bound (`overlap.bound`), summed kernel time (ms) and gpu_activities."""
    out = pd.DataFrame({"step": range(trace.n_steps)})
    r = trace.ranges
    prof = r[~r["on_device"] & r["name"].str.match(r"^ProfilerStep#\d+$") & (r["step"] >= 0)]
    numbers = prof.drop_duplicates("step").set_index("step")["name"].str.slice(13).astype(int)
    out["profiler_step"] = out["step"].map(numbers).astype("Int64")
    walls = views.phase_wall_times(trace)
    cpu = walls[walls["phase"] == STEP].set_index("step")["ms"]
    out["cpu_ms"] = out["step"].map(cpu).astype(float)
    if trace.device_type == "cuda":
        dev = overlap.breakdown(trace).set_index("step")
        for col in ("span_ms", "busy_ms", "idle_share", "host_wait_share"):
            out[f"gpu_{col}"] = out["step"].map(dev[col]).astype(float)
        out["bound"] = [overlap.bound(i, h) for i, h in
                        zip(out["gpu_idle_share"], out["gpu_host_wait_share"])]
        out["gpu_kernel_ms"] = out["step"].map(dev["kernel_ms"]).astype(float)
        out["gpu_activities"] = out["step"].map(dev["activities"]).astype("Int64")
    return out


def waits_headline(per_step: pd.DataFrame, step_ms: float | None = None,
                   of: str = "") -> str | None:
    """Where the step waits, in one line (`overlap.headline`), from `step_table`'s rows: the
    device's mean busy time against `step_ms` (what `of` says it is; default the mean device
    span); None on a CPU trace (no device: the step is the host's)."""
    if "gpu_busy_ms" not in per_step or per_step["gpu_busy_ms"].isna().all():
        return None
    busy, span = per_step["gpu_busy_ms"].mean(), per_step["gpu_span_ms"].mean()
    idle = (per_step["gpu_idle_share"] * per_step["gpu_span_ms"]).sum()
    host = (per_step["gpu_host_wait_share"] * per_step["gpu_span_ms"]).sum() / idle if idle else 0.0
    if step_ms is None:
        step_ms, of = span, f"of device span, mean of {len(per_step)} step(s)"
    return overlap.headline(busy, step_ms, of, host)


NESTED = {"loss": "forward"}
"""A phase inside another (the loss is computed in the forward range): its row is labelled
"loss (in forward)" and left out of the phases that add up to the step."""


def phase_label(phase: str) -> str:
    """A phase's row label: 'loss (in forward)' for a nested phase, else the phase."""
    return f"{phase} (in {NESTED[phase]})" if phase in NESTED else phase


def phase_times(trace: Trace, phases: list[str]) -> pd.DataFrame:
    """Per phase (and the whole step), means over the steps in ms: cpu_range_ms (the host
    ranges named after the phase; NaN where the trace has none), cpu_ops_ms (self time of the
    operators in the phase, every thread), and on a GPU trace gpu_span_ms, gpu_busy_ms,
    gpu_kernel_ms, gpu_idle_ms, gpu_host_wait_ms (`overlap.breakdown`), gpu_busy_share (of
    the step's busy time) and bound (`overlap.bound`). The top-level phases partition
    the step (forward includes the loss); a nested phase's row says so (`phase_label`) and is
    counted once, in its parent."""
    n = trace.n_steps
    walls = views.phase_wall_times(trace)
    rows = []
    for phase in phases + [STEP]:
        w = walls[walls["phase"] == phase]["ms"]
        rows.append({"phase": phase_label(phase), "cpu_range_ms": w.sum() / n if len(w) else np.nan,
                     "cpu_ops_ms": views.phase_total_ms(trace, phase, kind="ops") / n})
    out = pd.DataFrame(rows, columns=["phase", "cpu_range_ms", "cpu_ops_ms"])
    if trace.device_type == "cuda":
        cols = ["span_ms", "busy_ms", "idle_ms", "host_wait_ms", "kernel_ms"]
        sums = overlap.breakdown(trace, phases=True).groupby("phase")[cols].sum() / n
        sums.index = [phase_label(p) for p in sums.index]
        for col in cols:
            out[f"gpu_{col}"] = out["phase"].map(sums[col]).astype(float)
        span = out["gpu_span_ms"]
        out.insert(7, "bound", [overlap.bound(i, h) for i, h in
                                zip(out["gpu_idle_ms"] / span, out["gpu_host_wait_ms"] / span)])
        out["gpu_busy_share"] = out["gpu_busy_ms"] / sums["busy_ms"].get(STEP, np.nan)
    return out


def category_table(trace: Trace, phases: list[str]) -> pd.DataFrame:
    """category x phase: share of each phase's time (kernels on a GPU trace, else op self time;
    `views.phase_table`'s shares summed per category)."""
    rollup = pd.concat([views.phase_table(trace, p, top=None, classify=classify).assign(phase=p)
                        for p in phases])
    if rollup.empty:
        return pd.DataFrame(columns=["category", *phases])
    pivot = rollup.pivot_table(index="category", columns="phase", values="share", aggfunc="sum")
    pivot = pivot.reindex(columns=phases).fillna(0.0).sort_values(STEP, ascending=False)
    pivot.columns.name = None
    return pivot.reset_index()


def _findings(trace: Trace, per_step: pd.DataFrame, tables: dict[str, pd.DataFrame],
              phases: list[str], gpu: bool) -> list[str]:
    """Sentences over the measured numbers of this trace."""
    out = []
    table = tables[PHASE_TABLE].set_index("phase")["cpu_range_ms"]
    top = table[[p for p in phases if p not in NESTED and p in table.index]]
    if top.notna().any() and table.get(STEP, np.nan) > 0:
        nested = ", ".join(f"{p} inside {NESTED[p]}" for p in phases if p in NESTED)
        out.append(f"The phases' host ranges ({', '.join(top.index)}) add up to {top.sum():.1f} "
                   f"ms of the step's {table[STEP]:.1f} ms ({top.sum() / table[STEP]:.1%})"
                   + (f"; {nested}, counted once" if nested else "") + ".")
    if gpu and trace.unattributed_kernels:
        out.append(f"{trace.unattributed_kernels} device activities have no launch in the trace "
                   "and are in no step.")
    unit = "kernels" if gpu else "operators (self time)"
    for phase in phases:
        df = tables[f"top {unit}: {phase}"]
        if not df.empty:
            first = df.iloc[0]
            gemm = f" [{first['gemm']}]" if gpu and first.get("gemm") else ""
            out.append(f"Top {unit.split()[0][:-1]} of {phase}: {first['name'][:120]}{gemm} "
                       f"({first['share']:.1%} of the phase, "
                       f"{plural(first['calls_per_step'], 'call')} per step).")
    return out
