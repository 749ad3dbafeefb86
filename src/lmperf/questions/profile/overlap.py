"""Communication and computation on one rank's device timeline: where the GPU time goes per step
(HTA's temporal breakdown, idle time and comm/comp overlap), and the kernels that run slower
while a collective runs beside them.

Each device activity of a measured step (kernels, memcpys, memsets, placed in the step by their
launch, see `trace`) is one of three kinds, by HTA's rules (`hta/utils/utils.py`):
- communication: NCCL kernels of every name generation, `ncclKernel_*` (NCCL < 2.19) and
  `ncclDevKernel_*` (NCCL >= 2.19; HTA #208 counted these as zero communication), i.e. a name
  `nccl...Kernel...`, with or without a leading `void `;
- memory: memcpys and memsets (HTA: names starting Memcpy / Memset / dma);
- computation: every other kernel.

Per step, with each kind's intervals merged first (concurrent streams count once):
span (first start to last end, HTA's "kernel_time"), busy (union of all activities), idle =
span - busy, compute = |union of computation|, comm = |union of communication|, overlap =
|comm ∩ compute|, exposed_comm = comm - overlap (communication nothing hides), and
non_compute = span - compute - idle (HTA: communication and memory not under computation).
HTA computes the same over the whole trace window; `breakdown(..., whole=True)` does too.

NCCL kernel time includes the time a rank waits for its peers inside the collective: a rank that
finishes its computation early shows long communication. Which rank held the others up is read
across ranks (`ranks`), from computation, not from communication.

Shares are fractions (0..1) of the span, as every table of lmperf keeps them; the renderer writes
them as percent.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from lmperf.questions.profile.intervals import covered, merged
from lmperf.questions.profile.trace import Trace

COMM, COMPUTE, MEMORY = "communication", "computation", "memory"
_NCCL_KERNEL = re.compile(r"^(?:void\s+)?nccl\w*Kernel")

BREAKDOWN_COLUMNS = ["step", "span_ms", "busy_ms", "idle_ms", "compute_ms", "comm_ms", "overlap_ms",
                     "exposed_comm_ms", "memory_ms", "non_compute_ms", "idle_share",
                     "compute_share", "non_compute_share", "comm_hidden_share"]


def is_comm_kernel(name: str) -> bool:
    """Whether a device kernel name is an NCCL kernel (`ncclKernel_*`, `ncclDevKernel_*`, ...)."""
    return _NCCL_KERNEL.match(name) is not None


def activity_kinds(kernels: pd.DataFrame) -> np.ndarray:
    """communication / computation / memory for each row of `Trace.kernels` (see module)."""
    kind = kernels["kind"].to_numpy(dtype=object)
    names = kernels["name"]
    comm = names.map(is_comm_kernel).to_numpy(dtype=bool) if len(names) else np.zeros(0, bool)
    return np.where(kind != "kernel", MEMORY, np.where(comm, COMM, COMPUTE)).astype(object)


def _row(k: pd.DataFrame, kinds: np.ndarray, origin: float) -> dict[str, float]:
    """The breakdown of one set of activities (times relative to `origin`, in us -> ms)."""
    s = k["start_us"].to_numpy() - origin
    e = s + k["dur_us"].to_numpy()
    span = float(e.max() - s.min())
    ms, me = merged(s, e)
    busy = float((me - ms).sum())
    cs, ce = merged(s[kinds == COMPUTE], e[kinds == COMPUTE])
    xs, xe = merged(s[kinds == COMM], e[kinds == COMM])
    ys, ye = merged(s[kinds == MEMORY], e[kinds == MEMORY])
    compute, comm = float((ce - cs).sum()), float((xe - xs).sum())
    overlap = float(covered(xs, xe, cs, ce).sum())
    idle = span - busy
    return {"span_ms": span / 1e3, "busy_ms": busy / 1e3, "idle_ms": idle / 1e3,
            "compute_ms": compute / 1e3, "comm_ms": comm / 1e3, "overlap_ms": overlap / 1e3,
            "exposed_comm_ms": (comm - overlap) / 1e3, "memory_ms": float((ye - ys).sum()) / 1e3,
            "non_compute_ms": (span - compute - idle) / 1e3,
            "idle_share": idle / span if span > 0 else np.nan,
            "compute_share": compute / span if span > 0 else np.nan,
            "non_compute_share": (span - compute - idle) / span if span > 0 else np.nan,
            "comm_hidden_share": overlap / comm if comm > 0 else np.nan}


def breakdown(trace: Trace, whole: bool = False) -> pd.DataFrame:
    """One row per measured step (see the module for the columns; times in ms, shares 0..1);
    `whole`: one row (step -1) over every activity of the measured steps at once, HTA's window.
    Empty on a CPU trace."""
    k = trace.kernels
    if k.empty:
        return pd.DataFrame(columns=BREAKDOWN_COLUMNS)
    k = k[k["step"].to_numpy() >= 0]
    if k.empty:
        return pd.DataFrame(columns=BREAKDOWN_COLUMNS)
    kinds = activity_kinds(k)
    # Relative times: epoch timestamps (~1.7e15 us) hold starts to 0.25 us only.
    origin = float(k["start_us"].min())
    if whole:
        return pd.DataFrame([{"step": -1, **_row(k, kinds, origin)}], columns=BREAKDOWN_COLUMNS)
    steps = k["step"].to_numpy()
    rows = [{"step": int(step), **_row(k[steps == step], kinds[steps == step], origin)}
            for step in np.unique(steps)]
    return pd.DataFrame(rows, columns=BREAKDOWN_COLUMNS)


SLOWED_COLUMNS = ["name", "calls_alone", "mean_us_alone", "calls_overlapped", "mean_us_overlapped",
                  "slowdown", "extra_ms_per_step"]


def slowed_by_comm(trace: Trace, min_calls: int = 2) -> pd.DataFrame:
    """Per computation kernel name: its mean duration when it runs beside a collective (any part
    of it under an NCCL kernel, any stream of this rank) vs not (NCCL #1428: a GEMM 1.18 -> 2.08 ms
    while an all-gather ran). Names with at least `min_calls` calls each way, largest extra time
    first: slowdown = mean_us_overlapped / mean_us_alone, extra_ms_per_step = (mean_overlapped -
    mean_alone) x calls_overlapped / steps. A kernel is not always the same work under one name
    (shapes differ), so a slowdown is a lead to check, not a proof."""
    k = trace.kernels
    if k.empty:
        return pd.DataFrame(columns=SLOWED_COLUMNS)
    k = k[k["step"].to_numpy() >= 0]
    kinds = activity_kinds(k)
    origin = float(k["start_us"].min()) if len(k) else 0.0
    s = k["start_us"].to_numpy() - origin
    e = s + k["dur_us"].to_numpy()
    xs, xe = merged(s[kinds == COMM], e[kinds == COMM])
    comp = kinds == COMPUTE
    under = covered(s[comp], e[comp], xs, xe) > 0
    df = pd.DataFrame({"name": k["name"].to_numpy()[comp], "dur": k["dur_us"].to_numpy()[comp],
                       "under": under})
    g = df.groupby(["name", "under"])["dur"].agg(["count", "mean"]).unstack("under")
    if g.empty or True not in g.columns.get_level_values(1) or False not in g.columns.get_level_values(1):
        return pd.DataFrame(columns=SLOWED_COLUMNS)
    out = pd.DataFrame({
        "name": g.index.to_numpy(dtype=object),
        "calls_alone": g[("count", False)].fillna(0).to_numpy(int),
        "mean_us_alone": g[("mean", False)].to_numpy(float),
        "calls_overlapped": g[("count", True)].fillna(0).to_numpy(int),
        "mean_us_overlapped": g[("mean", True)].to_numpy(float),
    })
    out = out[(out["calls_alone"] >= min_calls) & (out["calls_overlapped"] >= min_calls)].copy()
    out["slowdown"] = out["mean_us_overlapped"] / out["mean_us_alone"]
    steps = max(trace.n_steps, 1)
    out["extra_ms_per_step"] = ((out["mean_us_overlapped"] - out["mean_us_alone"])
                                * out["calls_overlapped"] / 1e3 / steps)
    out = out.sort_values(["extra_ms_per_step", "name"], ascending=[False, True], kind="stable")
    return out.reset_index(drop=True)[SLOWED_COLUMNS]
