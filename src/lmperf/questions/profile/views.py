"""Views over a parsed Trace: small functions, each answering one question with a DataFrame.

Columns ending in `_ms` are milliseconds, `_us` microseconds; "per step" divides by the number
of measured steps. A phase's total (what shares are fractions of) is the self time of its CPU
ops (`kind="ops"`) or the summed duration of the device activities launched in it
(`kind="kernels"`): docs/commands/profile.md, "How a trace is read".
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np
import pandas as pd

from lmperf.questions.profile.range_names import ATTENTION_RANGES, STEP
from lmperf.questions.profile.trace import PHASE_LABELS, Trace

Classifier = Callable[[str], str]


def _kind(trace: Trace, kind: str) -> str:
    """'ops' or 'kernels' ('auto': kernels on a CUDA trace)."""
    return ("kernels" if trace.device_type == "cuda" else "ops") if kind == "auto" else kind


def _events(trace: Trace, phase: str, kind: str) -> tuple[pd.DataFrame, str]:
    """The events of `phase` (forward, loss, backward, optimizer or step; ops or device
    activities) and the column holding their time."""
    kind = _kind(trace, kind)
    df, col = (trace.kernels, "dur_us") if kind == "kernels" else (trace.ops, "self_us")
    if phase == STEP:
        mask = df["in_step"].to_numpy(dtype=bool)
    elif phase == "loss":
        mask = (df["phase_range"] == "loss").to_numpy(dtype=bool)
    else:
        mask = (df["phase"] == phase).to_numpy(dtype=bool)  # loss is part of forward
    return df[mask], col


def _per_step(trace: Trace) -> float:
    return float(trace.n_steps) if trace.n_steps else np.nan


def phase_total_ms(trace: Trace, phase: str, kind: str = "auto") -> float:
    """The phase total in ms over all measured steps (self op time or kernel time; see module)."""
    df, col = _events(trace, phase, kind)
    return float(df[col].sum()) / 1e3


def phase_table(trace: Trace, phase: str, top: int | None = 10, classify: Classifier | None = None,
                kind: str = "auto") -> pd.DataFrame:
    """Top operators (CPU: by self time) or device kernels (CUDA: by kernel time) of a phase.

    phase: forward (loss included), loss, backward, optimizer, or step (everything inside the
    `step` ranges). The phase total is the sum of the times of all events attributed to the phase
    (self times of cpu_ops, or durations of device activities, by launch) over all measured steps.
    Returns one row per name, largest first: name, [category when `classify` is given],
    calls_per_step, total_ms (all measured steps), ms_per_step, avg_us (per call), share (of the
    phase total). Shares are computed before truncating to `top` rows (None: all rows), so the
    shares of the full table sum to 1.0 and a truncated table keeps the same values.
    """
    df, col = _events(trace, phase, kind)
    g = df.groupby("name", sort=False)[col].agg(["count", "sum"])
    total = float(g["sum"].sum())
    n = _per_step(trace)
    out = pd.DataFrame({
        "name": g.index.to_numpy(dtype=object),
        "calls_per_step": g["count"].to_numpy() / n,
        "total_ms": g["sum"].to_numpy() / 1e3,
        "ms_per_step": g["sum"].to_numpy() / 1e3 / n,
        "avg_us": g["sum"].to_numpy() / g["count"].to_numpy(),
        "share": g["sum"].to_numpy() / total if total > 0 else np.zeros(len(g)),
    })
    out = out.sort_values(["total_ms", "name"], ascending=[False, True], kind="stable")
    out = out.reset_index(drop=True)
    if classify is not None:
        out.insert(1, "category", out["name"].map(classify))
    out.attrs.update(phase=phase, phase_total_ms=total / 1e3, kind=_kind(trace, kind))
    return out if top is None else out.head(top)


def phase_wall_times(trace: Trace) -> pd.DataFrame:
    """Wall time of each phase in each measured step on the host: one row per (step, phase).

    Columns: step (0-based), phase (step, forward, loss, backward, optimizer: those present), ms.
    Read from the CPU ranges (several ranges of one name in a step are summed; "forward time as
    profiled"; on CUDA a host range ends when its work is queued unless the step synchronises
    inside it: the device's span of a phase is `overlap.breakdown(trace, phases=True)`).
    """
    names = (STEP,) + PHASE_LABELS
    r = trace.ranges
    r = r[~r["on_device"] & (r["step"] >= 0)]
    # Phases by the name's label ("## forward ##" too); steps are the `step` ranges, or the
    # profiler's ProfilerStep#N where the program has none (as Trace.n_steps counts them).
    steps = r[r["name"] == STEP]
    if steps.empty:
        steps = r[r["name"].str.match(r"^ProfilerStep#\d+$")]
    r = pd.concat([steps.assign(label=STEP), r[r["label"].isin(PHASE_LABELS)]])
    out = r.groupby(["step", "label"], as_index=False)["dur_us"].sum()
    out = out.rename(columns={"label": "phase", "dur_us": "ms"})
    out["ms"] = out["ms"] / 1e3
    out["phase"] = out["phase"].astype(object)
    order = {n: i for i, n in enumerate(names)}
    out = out.sort_values(["step", "phase"], key=lambda c: c.map(order) if c.name == "phase" else c)
    return out.reset_index(drop=True)


def attention_breakdown(trace: Trace, flops: Mapping[str, Mapping[str, float]] | None = None,
                        kind: str = "auto") -> pd.DataFrame:
    """Time of the naive attention's three steps: scores, softmax, final matmul.

    Time is, on a CPU trace (`kind="ops"`), the wall time of the sub-ranges themselves; on a CUDA
    trace (`kind="kernels"`), the duration of the device activities launched inside them.
    Returns one row per sub-range: range, calls_per_step (ranges per step: one per layer and
    forward), ms_per_step, share (of the three's total). With `flops` (FLOPs per measured step
    by range name and source, e.g. {SOFTMAX: {"analytic": 1e9, "counted": 0}}) it adds, per
    source suffixed `_analytic`, `_counted`: flops_per_step, flop_share (`flop_analytic_share`,
    a share by its name), time_per_flop_share (share / flop_share: above 1 means slower than its
    FLOPs predict) and gflop_per_s (achieved, from ms_per_step); a zero count gives inf/NaN, not
    an error. Empty when the trace has none of the sub-ranges.
    """
    kind = _kind(trace, kind)
    n = _per_step(trace)
    r = trace.ranges
    r = r[~r["on_device"] & (r["step"] >= 0) & r["name"].isin(ATTENTION_RANGES)]
    counts = r.groupby("name").size()
    if counts.empty:  # no naive attention in the run (e.g. SDPA): nothing to break down
        return pd.DataFrame(columns=["range", "calls_per_step", "ms_per_step", "share"])
    if kind == "kernels":
        k = trace.kernels
        k = k[(k["step"] >= 0) & k["attention"].isin(ATTENTION_RANGES)]
        g = k.groupby("attention")["dur_us"].sum()
    else:
        g = r.groupby("name")["dur_us"].sum()
    total_us = np.array([g.get(name, 0.0) for name in ATTENTION_RANGES], dtype=float)
    out = pd.DataFrame({
        "range": list(ATTENTION_RANGES),
        "calls_per_step": [counts.get(name, 0) / n for name in ATTENTION_RANGES],
        "ms_per_step": total_us / 1e3 / n,
        "share": total_us / total_us.sum() if total_us.sum() > 0 else np.zeros(3),
    })
    ms = out["ms_per_step"].to_numpy()
    flops = flops or {}
    for source in dict.fromkeys(s for by_source in flops.values() for s in by_source):
        sfx = f"_{source}"
        f = np.array([flops.get(name, {}).get(source, np.nan) for name in ATTENTION_RANGES],
                     dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            out[f"flops_per_step{sfx}"] = f
            out[f"flop{sfx}_share"] = f / np.nansum(f)  # `*_share`: rendered as percent
            out[f"time_per_flop_share{sfx}"] = out["share"].to_numpy() / out[f"flop{sfx}_share"].to_numpy()
            out[f"gflop_per_s{sfx}"] = f / (ms * 1e-3) / 1e9
    out.attrs.update(kind=kind)
    return out
