"""The in-process runner of a ProfileSpec: capture with torch.profiler, parse the trace once,
answer the course's nsys_profile questions (a)-(e) with tables (docs/commands/profile.md) and
return the record.

It runs where the launcher puts it (a child process by default). Any failure of the run itself
is a record: out of memory an 'oom' row, anything else an 'error' row (core.outcome.failure);
a precision this device cannot run is 'unsupported'.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

import pandas as pd

from lmperf.core.envelope import measured
from lmperf.core.outcome import Stage
from lmperf.core.report import plural
from lmperf.measure.stats import summarize
from lmperf.results.schema import to_jsonable
from lmperf.workload.spec import RunSpec
from lmperf.workload.steps import PHASES
from lmperf.questions.profile import roofline, views
from lmperf.questions.profile.annotate import SCORES, SOFTMAX
from lmperf.questions.profile.capture import Capture, capture
from lmperf.questions.profile.classify import classify
from lmperf.questions.profile.flops import attention_flops
from lmperf.questions.profile.overlap import breakdown
from lmperf.questions.profile.from_trace import (
    CATEGORY_TABLE, category_table, kernel_table, phase_times, present_phases, step_table,
    waits_headline,
)
from lmperf.questions.profile.plan import default_trace
from lmperf.questions.profile.report import (
    KIND, PHASE_TIMES, WAITS_PHASE, WAITS_STEP, overhead_within_noise,
)
from lmperf.questions.profile.spec import ProfileSpec
from lmperf.questions.profile.trace import load_trace

Tables = list[tuple[str, pd.DataFrame]]


def run_profile(spec: ProfileSpec) -> dict:
    """Profile `spec` in this process and return its record (ok, oom, error or unsupported).

    Never raises for a failure of the run (`core.envelope.measured`): the record says what
    failed and while doing what.
    """
    return measured(KIND, spec, lambda spec, run: profile_torch(
        spec.workload(), Path(spec.trace) if spec.trace else default_trace(spec.workload()),
        top=spec.top, stage=run.stage), precision=spec.precision, record_spec=spec.record_spec())


def profile_torch(spec: RunSpec, trace_path: Path, top: int = 10,
                  stage: Stage | None = None) -> dict:
    """Profile `spec` with torch.profiler and analyse its trace: the ok record's fields, params
    and metrics (trace_path, tables as rows of numbers, notes, timings_s, samples_ms); raises
    what the run raises, with `stage` telling where it was."""
    stage = stage or Stage()
    cap = capture(spec, trace_path, stage)
    stage.now = "parsing the trace"
    start = time.perf_counter()
    trace = load_trace(trace_path)
    parse_s = time.perf_counter() - start
    stage.now = "analysing the trace"
    tables: Tables = []
    notes: list[str] = []
    _phase_times(tables, notes, spec, cap, trace)
    _waits(tables, notes, cap, trace)
    _top_tables(tables, notes, trace, spec, top)
    _attention(tables, notes, trace, spec)
    analysis_s = time.perf_counter() - start
    steps_s = sum(cap.profiled_ms["step"]) / 1e3
    timings = {"profiled_steps_s": steps_s, "compile_s": cap.compile_s,
               "capture_s": cap.capture_s, "trace_export_s": cap.export_s,
               "trace_parse_s": parse_s, "analysis_s": analysis_s}
    notes.append(
        f"Profiling cost: {spec.steps} profiled steps took {steps_s:.2f} s; exporting the trace "
        f"{cap.export_s:.2f} s, parsing it {parse_s:.2f} s and the whole analysis {analysis_s:.2f} s "
        f"({(cap.export_s + analysis_s) / steps_s:.2f}x the steps).")
    _roofline(tables, notes, timings, trace, spec, cap, top, stage)
    return {"params": cap.params, "metrics": {
        "trace_path": str(trace_path),
        "tables": {title: to_jsonable(df.to_dict(orient="records")) for title, df in tables},
        "notes": notes, "timings_s": timings,
        "samples_ms": to_jsonable({"benchmarked": cap.unprofiled_ms,
                                   "profiled": cap.profiled_ms})}}


def _roofline(tables: Tables, notes: list[str], timings: dict, trace, spec: RunSpec,
              cap: Capture, top: int, stage: Stage) -> None:
    """Ideal vs actual per op and phase (`profile.roofline`); the phases' measured times are
    the benchmarked ones (no profiler). A model the op counter cannot run is a note, not a
    failed profile."""
    start = time.perf_counter()
    bench_ms = {p: statistics.fmean(xs) for p, xs in cap.unprofiled_ms.items() if xs}
    try:
        more_tables, more_notes = roofline.analyse(trace, spec, bench_ms, top, stage)
    except Exception as exc:  # noqa: BLE001 - the profile itself succeeded
        notes.append(f"Roofline skipped: {type(exc).__name__}: {str(exc)[:160]}")
        return
    tables += more_tables
    notes += more_notes
    timings["roofline_s"] = time.perf_counter() - start


def _noise_words(is_noise: bool | None) -> str:
    return {True: ", within noise", False: "", None: ", too few steps to judge noise"}[is_noise]


def _phase_times(tables: Tables, notes: list[str], spec: RunSpec, cap: Capture, trace) -> None:
    """(a) each phase as benchmarked (no profiler), under the profiler, and in the trace."""
    # On CUDA a host range closes when its work is queued; the device span of its activities
    # is the work itself, which is what "forward time" means there.
    walls = (breakdown(trace, phases=True).rename(columns={"span_ms": "ms"})
             if trace.device_type == "cuda" else views.phase_wall_times(trace))
    rows = []
    noise: dict[str, bool | None] = {}
    for phase in PHASES[spec.mode] + ("step",):
        bench, prof = cap.unprofiled_ms[phase], cap.profiled_ms[phase]
        in_trace = walls[walls["phase"] == phase]["ms"].tolist() if not walls.empty else []
        row: dict = {"phase": phase}
        for name, xs in (("benchmarked", bench), ("profiled", prof), ("trace_range", in_trace)):
            s = summarize(xs) if xs else {"mean": math.nan, "std": math.nan}
            row[f"{name}_ms_mean"], row[f"{name}_ms_std"] = s["mean"], s["std"]
        row["overhead_pct"] = 100 * (row["profiled_ms_mean"] / row["benchmarked_ms_mean"] - 1)
        noise[phase] = overhead_within_noise(bench, prof)  # a note, not a column: tables stay numeric
        rows.append(row)
    tables.append((PHASE_TIMES, pd.DataFrame(rows)))
    fwd = rows[0]
    in_range = ("no forward range in the trace" if math.isnan(fwd["trace_range_ms_mean"]) else
                f"{fwd['trace_range_ms_mean']:.2f} ± {fwd['trace_range_ms_std']:.2f} ms as the "
                "trace's forward range")
    notes.append(
        f"(a) forward: {fwd['benchmarked_ms_mean']:.2f} ± {fwd['benchmarked_ms_std']:.2f} ms "
        f"benchmarked without the profiler, {fwd['profiled_ms_mean']:.2f} ± "
        f"{fwd['profiled_ms_std']:.2f} ms under it ({fwd['overhead_pct']:+.1f}%"
        f"{_noise_words(noise[fwd['phase']])}), {in_range}.")
    noisy = [phase for phase, is_noise in noise.items() if is_noise]
    if noisy:
        notes.append(
            f"Profiler overhead within the run-to-run noise (|difference of means| <= 2 standard "
            f"errors) for: {', '.join(noisy)}; those percentages say nothing about the profiler.")


def _waits(tables: Tables, notes: list[str], cap: Capture, trace) -> None:
    """Where the step waits (`overlap`): per profiled step and per phase, the device's busy,
    idle and host-wait time, and first among the notes the headline, against the benchmarked
    step (the profiler slows the host, so the trace's own idle time overstates it)."""
    if trace.device_type != "cuda":
        notes.insert(0, "No GPU in this run: the whole step is the host's (the operator tables "
                        "say where its time goes).")
        return
    per_step = step_table(trace)
    tables += [(WAITS_STEP, per_step), (WAITS_PHASE, phase_times(trace, present_phases(trace)))]
    bench = statistics.fmean(cap.unprofiled_ms["step"])
    busy, span = per_step["gpu_busy_ms"].mean(), per_step["gpu_span_ms"].mean()
    notes.insert(0, waits_headline(per_step, bench, f"benchmarked; {busy / span:.0%} of the "
                                   f"{span:.2f} ms profiled step"))


def _top_tables(tables: Tables, notes: list[str], trace, spec: RunSpec, top: int) -> None:
    """(b)-(d) top entries per phase, categories, matmul share, forward vs step."""
    cuda = trace.device_type == "cuda"
    unit = "kernels" if cuda else "operators (self time)"
    phases = PHASES[spec.mode] + ("step",)
    top_of = {}
    for phase in phases:
        df = (kernel_table(trace, phase, top) if cuda else
              views.phase_table(trace, phase, top=top, classify=classify))
        top_of[phase] = df
        tables.append((f"top {unit}: {phase}", df))
    shares = category_table(trace, list(phases))
    tables.append((CATEGORY_TABLE, shares))

    fwd = top_of["forward"]
    if not fwd.empty:
        first = fwd.iloc[0]
        notes.append(f"(b) top forward {unit.split()[0][:-1]}: {first['name']} "
                            f"({first['share']:.1%} of forward, {plural(first['calls_per_step'], 'call')} per step).")
    by = shares.set_index("category")
    lead = by["forward"].drop("matmul", errors="ignore").sort_values(ascending=False).head(3)
    if (lead > 0).any():
        notes.append("(c) besides matmuls, the forward pass spends " + ", ".join(
            f"{share:.1%} in {name}" for name, share in lead[lead > 0].items()) + ".")
    if len(phases) > 2:
        step = top_of["step"]
        share_f, share_s = (by[p].get("matmul", 0.0) for p in ("forward", "step"))
        same = (not step.empty and not fwd.empty and step.iloc[0]["name"] == fwd.iloc[0]["name"])
        notes.append(
            f"(d) matmul share: {share_f:.1%} of forward, {share_s:.1%} of the whole step; the top "
            f"entry of the step is {'the same as' if same else 'different from'} the forward pass's"
            + ("" if same or step.empty else f" ({step.iloc[0]['name']})") + ".")


def _attention(tables: Tables, notes: list[str], trace, spec: RunSpec) -> None:
    """(e) scores / softmax / final matmul: runtime against FLOPs."""
    if spec.attention != "naive" or spec.model is not None:
        notes.append("(e) the attention breakdown needs the reference LM's naive attention "
                            "(--attention naive): fused kernels have no sub-ranges.")
        return
    flops = attention_flops(spec.batch, spec.context, spec.num_heads,
                            spec.d_model // spec.num_heads, spec.num_layers)
    df = views.attention_breakdown(trace, flops)
    if df.empty:
        return
    tables.append(("attention: runtime vs FLOPs per forward step", df))
    by = df.set_index("range")
    if {SCORES, SOFTMAX}.issubset(by.index):
        t_ratio = by.loc[SOFTMAX, "ms_per_step"] / by.loc[SCORES, "ms_per_step"]
        f_ratio = flops[SOFTMAX]["analytic"] / flops[SCORES]["analytic"]
        notes.append(
            f"(e) softmax has {f_ratio:.3f}x the FLOPs of the score matmul (analytic; the counter "
            f"counts {flops[SOFTMAX]['counted']} for it) but takes {t_ratio:.2f}x its time: "
            "it is bound by memory traffic, not arithmetic.")
