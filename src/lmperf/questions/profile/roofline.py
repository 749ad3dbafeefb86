"""Ideal vs actual: a roofline per operator and per phase of a profiled step.

Per aten op of a phase (FLOPs and bytes from `estimate.op_costs`, counted on fake tensors; times
from the trace): compute_ms = FLOPs / the attained matmul FLOP/s of its dtype, memory_ms = bytes
/ the attained bandwidth (`runtime.ceilings`), ideal_ms = the larger, and a `label` read off
them. Measured time per op counts nothing twice: a CPU op's self time, or on CUDA the kernels it
launched, goes to its outermost ancestor-or-self that the counter saw (`copy_` inside
`_to_copy` is `_to_copy`'s). The method in full: docs/commands/profile.md, "Roofline".
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from lmperf.units import MIB

if TYPE_CHECKING:
    from lmperf.runtime.ceilings import Ceilings

OVERHEAD_RATIO = 10.0  # measured > 10x the roofline time: the op is bound by neither ceiling
PHASES: tuple[str, ...] = ("forward", "backward", "optimizer")
PER_OP = "roofline per operator (per step; ideal = max(FLOPs/compute, bytes/bandwidth))"
PER_PHASE = "roofline per phase: measured vs ideal (ms per step)"
CEILINGS = "device ceilings (measured here)"


def label(compute_ms: float, memory_ms: float, measured_ms: float) -> str:
    """'compute-bound', 'memory-bound' or 'overhead-bound' from a row's numbers (see module)."""
    ideal = max(compute_ms, memory_ms)
    if ideal <= 0 or measured_ms > OVERHEAD_RATIO * ideal:
        return "overhead-bound"
    return "compute-bound" if compute_ms >= memory_ms else "memory-bound"


def _owners(names: np.ndarray, starts: np.ndarray, ends: np.ndarray, counted: set[str],
            points: np.ndarray | None = None) -> tuple[list[str], list[str]]:
    """One thread's ops (sorted by start, outer before inner) -> the owner of each op's self
    time; and, for each time in `points` (sorted), the owner of a kernel launched then (the
    innermost op open at that time, folded into its outermost counted ancestor), '' if none."""
    stack: list[tuple[float, str, str | None]] = []  # (end, name, outermost counted ancestor)
    op_owner: list[str] = []
    point_owner: list[str] = []
    points = np.empty(0) if points is None else points
    p = 0
    for name, start, end in zip(names, starts, ends):
        while p < len(points) and points[p] < start:
            point_owner.append(_point_owner(stack, points[p]))
            p += 1
        while stack and stack[-1][0] <= start:
            stack.pop()
        outer = stack[-1][2] if stack else None
        outer = outer or (name if name in counted else None)
        stack.append((end, name, outer))
        op_owner.append(outer or name)
    while p < len(points):
        point_owner.append(_point_owner(stack, points[p]))
        p += 1
    return op_owner, point_owner


def _point_owner(stack: list[tuple[float, str, str | None]], t: float) -> str:
    while stack and stack[-1][0] <= t:
        stack.pop()
    return (stack[-1][2] or stack[-1][1]) if stack else ""


def measured_per_op(trace, counted: set[str]) -> pd.DataFrame:
    """Measured ms per step of each (phase, owner op) in the trace's measured steps, and the
    calls per step of ops under that name: columns phase, op, measured_ms, calls."""
    ops = trace.ops.sort_values(["pid", "tid", "start_us", "end_us"],
                                ascending=[True, True, True, False])
    cuda = trace.device_type == "cuda"
    kernels = trace.kernels if cuda else trace.kernels.iloc[0:0]
    parts = []
    for (pid, tid), group in ops.groupby(["pid", "tid"], sort=False):
        mine = kernels[kernels["launch_tid"] == tid].sort_values("launch_us") if len(kernels) \
            else kernels
        owners, kernel_owners = _owners(group["name"].to_numpy(), group["start_us"].to_numpy(),
                                        group["end_us"].to_numpy(), counted,
                                        mine["launch_us"].to_numpy() if len(mine) else None)
        if len(mine):  # CUDA: the time is the kernels'; the ops only count calls
            parts.append(pd.DataFrame({"phase": mine["phase"].to_numpy(), "op": kernel_owners,
                                       "us": mine["dur_us"].to_numpy(), "call": 0,
                                       "in_step": mine["in_step"].to_numpy(dtype=bool)}))
        parts.append(pd.DataFrame({"phase": group["phase"].to_numpy(), "op": owners,
                                   "us": 0.0 if cuda else group["self_us"].to_numpy(),
                                   "call": (group["name"].to_numpy() == np.asarray(owners))
                                   .astype(int),
                                   "in_step": group["in_step"].to_numpy(dtype=bool)}))
    if not parts:
        return pd.DataFrame(columns=["phase", "op", "measured_ms", "calls"])
    df = pd.concat(parts, ignore_index=True)
    df = df[df["in_step"] & df["phase"].isin(PHASES) & (df["op"] != "")]
    steps = max(int(trace.n_steps), 1)
    out = df.groupby(["phase", "op"], sort=False).agg(us=("us", "sum"), calls=("call", "sum"))
    out = out.reset_index()
    out["measured_ms"] = out.pop("us") / steps / 1e3
    out["calls"] = out["calls"] / steps
    return out


def per_op_table(costs: pd.DataFrame, measured: pd.DataFrame, ceilings: "Ceilings"
                 ) -> pd.DataFrame:
    """One row per (phase, op): FLOPs and bytes per step (counted), measured ms per step, the
    roofline's compute / memory / ideal ms, attained GFLOP/s and GB/s, the ratio and the label.
    `costs` is `OpCosts.table`; `measured` is `measured_per_op`."""
    from lmperf.estimate.time_model import Target, op_times

    # the one time model's roofline at this device's measured ceilings (fractions 1): a bf16
    # matmul is held to the bf16 ceiling, an fp32 one to fp32's
    bandwidth = ceilings.bandwidth_bytes_per_s
    target = Target(ceilings.device_name, dict(ceilings.matmul_flops_per_s), bandwidth, None,
                    ceilings.op_overhead_s, "measured", ceilings.device == "cpu", "measured")
    compute_s = op_times(costs, target)[0]
    costs = costs.assign(bytes=costs["bytes_read"] + costs["bytes_written"],
                         compute_ms=compute_s * 1e3)
    agg = costs.groupby(["phase", "op"], sort=False).agg(
        op_class=("op_class", "first"), dtype=("dtype", lambda s: "/".join(dict.fromkeys(s))),
        flops=("flops", "sum"), bytes=("bytes", "sum"), counted_calls=("calls", "sum"),
        compute_ms=("compute_ms", "sum")).reset_index()
    df = agg.merge(measured, on=["phase", "op"], how="outer")
    df["op_class"] = df["op_class"].fillna("not counted")
    df["dtype"] = df["dtype"].fillna("-")
    for col in ("flops", "bytes", "counted_calls", "compute_ms", "measured_ms", "calls"):
        df[col] = df[col].fillna(0.0)
    df["memory_ms"] = df["bytes"] / bandwidth * 1e3
    df["ideal_ms"] = np.maximum(df["compute_ms"], df["memory_ms"])
    df["intensity_flop_per_byte"] = np.where(df["bytes"] > 0, df["flops"] / df["bytes"].where(
        df["bytes"] > 0, 1), math.nan)
    seconds = (df["measured_ms"] / 1e3).where(df["measured_ms"] > 0)
    df["attained_gflop_per_s"] = df["flops"] / seconds / 1e9
    df["attained_gb_per_s"] = df["bytes"] / seconds / 1e9
    df["measured_over_ideal"] = df["measured_ms"] / df["ideal_ms"].where(df["ideal_ms"] > 0)
    df["bound"] = [label(*x) for x in zip(df["compute_ms"], df["memory_ms"], df["measured_ms"])]
    order = {p: i for i, p in enumerate(PHASES)}
    df = df.sort_values(["phase", "measured_ms"], key=lambda s: s.map(order) if s.name == "phase"
                        else -s).reset_index(drop=True)
    df["gflop"], df["mb"] = df["flops"] / 1e9, df["bytes"] / 1e6
    return df[["phase", "op", "op_class", "dtype", "calls", "gflop", "mb",
               "intensity_flop_per_byte", "measured_ms", "compute_ms", "memory_ms", "ideal_ms",
               "measured_over_ideal", "attained_gflop_per_s", "attained_gb_per_s", "bound"]]


def top_per_phase(per_op: pd.DataFrame, top: int) -> pd.DataFrame:
    """The `top` ops of each phase by measured time, and one "(N other ops)" row per phase
    that sums the rest (FLOPs, bytes, times; no label: its ops have their own), so a phase's
    rows still add up to the phase."""
    parts = []
    for phase, ops in per_op.groupby("phase", sort=False):
        ops = ops.sort_values("measured_ms", ascending=False)
        parts.append(ops.head(top))
        rest = ops.iloc[top:]
        if len(rest):
            row = {c: rest[c].sum() for c in ("calls", "gflop", "mb", "measured_ms",
                                              "compute_ms", "memory_ms", "ideal_ms")}
            seconds = row["measured_ms"] / 1e3
            row.update(phase=phase, op=f"({len(rest)} other ops)", op_class="-", dtype="-",
                       intensity_flop_per_byte=row["gflop"] / row["mb"] * 1e-3
                       if row["mb"] > 0 else math.nan,
                       measured_over_ideal=row["measured_ms"] / row["ideal_ms"]
                       if row["ideal_ms"] > 0 else math.nan,
                       attained_gflop_per_s=row["gflop"] / seconds if seconds > 0 else math.nan,
                       attained_gb_per_s=row["mb"] / 1e3 / seconds if seconds > 0 else math.nan,
                       bound="-")
            parts.append(pd.DataFrame([row]))
    return pd.concat(parts, ignore_index=True)[list(per_op.columns)] if parts else per_op


def per_phase_table(per_op: pd.DataFrame, phase_ms: dict[str, float]) -> pd.DataFrame:
    """Per phase and for the whole step: measured ms (the phase's wall time, `phase_ms`), the
    ops' attributed ms, the ideal ms (sum of the ops' roofline times), compute / memory ms,
    measured/ideal, and the ms above the ideal with the op that contributes most of it."""
    rows = []
    for phase in [p for p in PHASES if p in set(per_op["phase"])] + ["step"]:
        ops = per_op if phase == "step" else per_op[per_op["phase"] == phase]
        measured = phase_ms.get(phase, math.nan)
        if phase == "step" and math.isnan(measured):
            measured = sum(v for k, v in phase_ms.items() if k in PHASES)
        ideal = float(ops["ideal_ms"].sum())
        excess = ops["measured_ms"] - ops["ideal_ms"]
        worst = ops.loc[excess.idxmax()] if len(ops) else None
        rows.append({
            "phase": phase, "measured_ms": measured, "ops_ms": float(ops["measured_ms"].sum()),
            "ideal_ms": ideal, "compute_ms": float(ops["compute_ms"].sum()),
            "memory_ms": float(ops["memory_ms"].sum()),
            "measured_over_ideal": measured / ideal if ideal > 0 else math.nan,
            "above_ideal_ms": measured - ideal,
            "overhead_bound_ms": float(ops.loc[ops["bound"] == "overhead-bound",
                                               "measured_ms"].sum()),
            "most_above_ideal": "-" if worst is None else f"{worst['phase']}: {worst['op']}"
            if phase == "step" else ("-" if worst is None else worst["op"]),
        })
    return pd.DataFrame(rows)


def ceilings_table(ceilings: "Ceilings", peaks: dict[str, float] | None = None) -> pd.DataFrame:
    """The measured ceilings as rows (what, value, unit, how), beside the datasheet peak where
    the peak table has one (`peaks`: 'fp32'/'bf16'/... -> FLOP/s, 'bandwidth' -> bytes/s)."""
    peaks = peaks or {}
    rows = [{"ceiling": f"matmul {d}", "attained": v / 1e9, "unit": "GFLOP/s",
             "datasheet_peak": peaks.get(d, math.nan) / 1e9,
             "how": f"({ceilings.matmul_n[d]}, {ceilings.matmul_n[d]}) @ "
                    f"({ceilings.matmul_n[d]}, {ceilings.matmul_n[d]}), best of 3"}
            for d, v in ceilings.matmul_flops_per_s.items()]
    mib = ceilings.stream_bytes / MIB
    rows += [{"ceiling": "bandwidth (copy)", "attained": ceilings.copy_bytes_per_s / 1e9,
              "unit": "GB/s", "datasheet_peak": peaks.get("bandwidth", math.nan) / 1e9,
              "how": f"y.copy_(x), {mib:.0f} MiB fp32, best of 3"},
             {"ceiling": "bandwidth (triad)", "attained": ceilings.triad_bytes_per_s / 1e9,
              "unit": "GB/s", "datasheet_peak": peaks.get("bandwidth", math.nan) / 1e9,
              "how": f"z = x + 2 y, {mib:.0f} MiB fp32 each, best of 3"}]
    return pd.DataFrame(rows)


def findings(per_op: pd.DataFrame, per_phase: pd.DataFrame) -> list[str]:
    """Sentences over the tables' numbers: the step against its ideal, and the op furthest
    above its roofline time."""
    notes = []
    step = per_phase[per_phase["phase"] == "step"]
    if len(step) and step.iloc[0]["ideal_ms"] > 0:
        s = step.iloc[0]
        notes.append(
            f"Roofline: the step took {s['measured_ms']:.2f} ms against an ideal of "
            f"{s['ideal_ms']:.2f} ms ({s['measured_over_ideal']:.1f}x; compute {s['compute_ms']:.2f}"
            f" ms, memory {s['memory_ms']:.2f} ms at this device's measured ceilings); "
            f"{s['overhead_bound_ms']:.2f} ms of it is in ops more than {OVERHEAD_RATIO:g}x above "
            "their roofline time or with no FLOPs and bytes (overhead-bound).")
    counted = per_op[per_op["ideal_ms"] > 0]
    if len(counted):
        top = counted.loc[(counted["measured_ms"] - counted["ideal_ms"]).idxmax()]
        notes.append(
            f"Roofline: the op furthest above its ideal is {top['op']} in {top['phase']} "
            f"({top['measured_ms']:.2f} ms vs {top['ideal_ms']:.2f} ms ideal, "
            f"{top['measured_over_ideal']:.1f}x, {top['bound']}).")
    return notes


def analyse(trace, spec, phase_ms: dict[str, float], top: int = 10,
            stage=None) -> tuple[list[tuple[str, pd.DataFrame]], list[str]]:
    """The roofline of a profiled run: measure this device's ceilings (in this process, with
    the run's threads and TF32 setting), count `spec`'s per-op costs on fake tensors, join them
    with the trace's measured ops. Returns (title, table) pairs (ceilings, per phase, per op:
    the `top` ops of each phase) and findings. `phase_ms`: phase -> measured ms per step."""
    import torch

    from lmperf.runtime.ceilings import datasheet_peaks, measure_ceilings
    from lmperf.estimate.op_costs import count_op_costs
    from lmperf.runtime.precision import LOW_NAMES, compute_dtype, get_regime, matmul_precision

    regime = get_regime(spec.precision)
    dtypes = tuple(dict.fromkeys(("fp32", LOW_NAMES.get(compute_dtype(regime), "bf16"))))
    if stage is not None:
        stage.now = "measuring the device's ceilings (roofline)"
    with matmul_precision(regime):
        ceilings = measure_ceilings(torch.device(spec.device), dtypes)
    if stage is not None:
        stage.now = "counting FLOPs and bytes per operator (roofline)"
    costs = count_op_costs(spec)
    measured = measured_per_op(trace, set(costs.table["op"]))
    per_op = per_op_table(costs.table, measured, ceilings)
    per_phase = per_phase_table(per_op, phase_ms)
    tables = [(CEILINGS, ceilings_table(ceilings, datasheet_peaks(ceilings.device_name))),
              (PER_PHASE, per_phase), (PER_OP, top_per_phase(per_op, top))]
    notes = findings(per_op, per_phase) + [
        f"Roofline method: FLOPs and bytes per op {costs.method} ({costs.count_s:.1f} s); "
        f"ceilings measured here with {ceilings.threads} thread(s); bound = compute or memory by "
        f"the larger of FLOPs/compute and bytes/bandwidth, overhead-bound when measured > "
        f"{OVERHEAD_RATIO:g}x that (dispatch, Python, launches, or work without a FLOP formula, "
        "e.g. exp and log) or when the op moves no bytes (views, autograd bookkeeping)."]
    return tables, notes
