"""Where the GPU time goes per step on one device timeline: busy, idle and the host's share of
the idle time (HTA's temporal and idle-time breakdowns).

The device activities (kernels, memcpys, memsets) of a measured step are placed by their launch;
their intervals are merged before they are measured (concurrent streams count once). The columns
(span, busy, idle, host wait) and the `bound` rule: docs/commands/profile.md, "Where the step
waits". Shares are fractions (0..1) of the span; the renderer writes them as percent.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from lmperf.questions.profile.intervals import merged
from lmperf.questions.profile.trace import PHASE_LABELS, Trace

BREAKDOWN_COLUMNS = ["step", "phase", "activities", "span_ms", "busy_ms", "kernel_ms", "idle_ms",
                     "host_wait_ms", "idle_share", "host_wait_share"]
IDLE_BOUND = 0.5
"""Idle more than this share of the time: the device is not what the step waits for."""
LEVERS = ("a larger batch (more work per op), CUDA graphs or torch.compile (one launch for many "
          "kernels), fewer small ops (fused kernels, a fused optimizer)")


def _row(k: pd.DataFrame, origin: float) -> dict[str, float]:
    """The breakdown of one set of activities (times relative to `origin`, in us -> ms)."""
    s = k["start_us"].to_numpy() - origin
    e = s + k["dur_us"].to_numpy()
    span = float(e.max() - s.min())
    ms, me = merged(s, e)
    busy = float((me - ms).sum())
    idle = span - busy
    host_wait = _host_wait(s, e, k["launch_end_us"].to_numpy(dtype=float) - origin)
    share = (lambda x: x / span) if span > 0 else (lambda x: np.nan)
    return {"activities": len(k), "span_ms": span / 1e3, "busy_ms": busy / 1e3,
            "kernel_ms": float(k["dur_us"].sum()) / 1e3, "idle_ms": idle / 1e3,
            "host_wait_ms": host_wait / 1e3, "idle_share": share(idle),
            "host_wait_share": share(host_wait)}


def _host_wait(s: np.ndarray, e: np.ndarray, queued: np.ndarray) -> float:
    """Length of the gaps in the union of [s, e) whose next activity was queued (its launch call
    returned) only after the gap began: the device had nothing to run, it waited for the host."""
    order = np.argsort(s, kind="stable")
    s, queued = s[order], queued[order]
    reach = np.maximum.accumulate(e[order])[:-1]  # everything before activity i ends by then
    gap = s[1:] - reach
    return float(gap[(gap > 0) & (queued[1:] > reach)].sum())


def breakdown(trace: Trace, phases: bool = False) -> pd.DataFrame:
    """One row per measured step (see the module for the columns; times in ms, shares 0..1,
    phase 'step'); `phases`: one row per step and phase present ('step', then forward (loss
    included), loss, backward, optimizer), each phase's activities by their launch. Empty on a
    CPU trace."""
    k = trace.kernels
    k = k[k["step"].to_numpy() >= 0] if len(k) else k
    if k.empty:
        return pd.DataFrame(columns=BREAKDOWN_COLUMNS)
    # Relative times: epoch timestamps (~1.7e15 us) hold starts to 0.25 us only.
    origin = float(k["start_us"].min())
    groups = [("step", np.ones(len(k), bool))]
    if phases:
        phase, inner = k["phase"].to_numpy(dtype=object), k["phase_range"].to_numpy(dtype=object)
        groups += [(p, (inner if p == "loss" else phase) == p) for p in PHASE_LABELS]
    rows = []
    for step, at in k.groupby("step", sort=True).indices.items():  # positions, one pass
        for name, mask in groups:
            sel = at[mask[at]]
            if len(sel):
                rows.append({"step": int(step), "phase": name, **_row(k.iloc[sel], origin)})
    return pd.DataFrame(rows, columns=BREAKDOWN_COLUMNS)


def bound(idle_share: float, host_wait_share: float) -> str:
    """'host-bound' (the device idle more than IDLE_BOUND of the time, most of it waiting for the
    host's launches), 'idle' (as idle, with its work already queued: a synchronisation, another
    stream or a peer), or 'device-bound' (busy at least 1 - IDLE_BOUND of the time)."""
    if not idle_share > IDLE_BOUND:
        return "device-bound"
    return "host-bound" if host_wait_share >= idle_share / 2 else "idle"


def headline(busy_ms: float, step_ms: float, of: str, host_of_idle: float) -> str:
    """The one-line answer to "where does the step wait?": the `bound` of a step of `step_ms`
    (what `of` says it is) whose device was busy `busy_ms`, `host_of_idle` (0..1) of the idle
    time waiting for the host's launches; the figures, and the levers of a host-bound step."""
    busy = min(1.0, busy_ms / step_ms)  # profiled kernels can outlast a benchmarked step
    label = bound(1 - busy, (1 - busy) * host_of_idle)
    figures = (f"the GPU was busy {busy:.0%} of the step ({busy_ms:.2f} of "
               f"{step_ms:.2f} ms {of}; {host_of_idle:.0%} of its idle time waiting for the "
               "host's launches)")
    if label == "host-bound":
        return f"host-bound: {figures}; levers: {LEVERS}."
    if label == "idle":
        return (f"GPU idle with its work queued: {figures}: it waits on a synchronisation, "
                "another stream or a peer.")
    return f"device-bound: {figures}; the kernels set the step time (see the top kernels)."

