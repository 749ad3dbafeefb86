"""How long a step's ops take on a device: one time model for every target, GPU or CPU (the
roofline per op at attained fractions, a host issuing each op: docs/commands/plan.md, "The
time model")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pandas as pd

# glibc maps every allocation above its largest mmap threshold (DEFAULT_MMAP_THRESHOLD_MAX, 32
# MiB on 64-bit: malloc/malloc.c) afresh and unmaps it on free: such an output is faulted in page
# by page on every call; smaller ones reuse the heap
MMAP_MAX_BYTES = 32 * 2**20


@dataclass(frozen=True)
class Fraction:
    """The attained fraction of peak for one op class, of compute and of memory bandwidth."""

    compute: float
    memory: float
    source: str


@dataclass(frozen=True)
class Target:
    """A device to predict for: its name, FLOP/s per math dtype ('fp32', 'tf32', 'bf16',
    'fp16'), bandwidth (bytes/s), the attained fractions per op class (None: the figures are
    attained ones already, fractions 1), the host's seconds to issue one op and where that
    figure comes from, whether the host waits for each op (`synchronous`: a CPU), the source
    of the figures, math dtype -> what a prediction in it cannot vouch for, and the rate at
    which an op writes a fresh output above glibc's largest mmap threshold (a CPU's page
    faults, `runtime.ceilings.fresh_write`; None: a caching allocator, as on a GPU)."""

    name: str
    flops_per_s: dict[str, float]
    bandwidth: float
    fractions: dict[str, Fraction] | None
    host_op_s: float
    host_source: str
    synchronous: bool
    source: str
    caveats: dict[str, str] = field(default_factory=dict)
    fresh_bytes_per_s: float | None = None

    @property
    def streaming_bytes_per_s(self) -> float:
        """The rate a streaming (elementwise) kernel moves bytes at: the bandwidth times that
        class's attained fraction (1 when the figures are attained ones already)."""
        share = (self.fractions or {}).get("elementwise/norm")
        return self.bandwidth * (share.memory if share else 1.0)

    def __hash__(self) -> int:  # by value (its dicts are not hashable): caches key on it
        return hash((self.name, self.bandwidth, self.host_op_s, self.synchronous,
                     self.fresh_bytes_per_s,
                     tuple(sorted(self.flops_per_s.items()))))


class PhaseTime(NamedTuple):
    """One phase of one step on a target (seconds, except the counts): the roofline ideal, the
    predicted (typical) time, its device and host totals, and the FLOPs, bytes and op calls."""

    ideal_s: float
    typical_s: float
    device_s: float
    host_s: float
    flops: int
    bytes: int
    calls: int


def op_times(table: pd.DataFrame, target: Target, tf32: bool = False
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(compute s, memory s, device s) of each row of an `OpCosts.table` on `target`, summed
    over the row's calls: its FLOPs at the peak of its dtype, its bytes at the peak bandwidth
    (the roofline ideal is the larger of the two), and the larger of both at the attained
    fractions of its op class, plus on a CPU the page faults of each forward or backward output
    of MMAP_MAX_BYTES or more (not written in place: an op named `..._`; attention's and the
    optimizer's left out, below) at `target.fresh_bytes_per_s`. fp32
    rows run at TF32's peak in the tf32 regime; a dtype the target has no figure for runs at
    its fp32 (or TF32) rate."""
    fp32 = target.flops_per_s.get("tf32" if tf32 else "fp32") or max(target.flops_per_s.values())
    dtype = table["dtype"].where(~(tf32 & (table["dtype"] == "fp32")), "tf32")
    rate = dtype.map(lambda d: target.flops_per_s.get(d, fp32)).astype(float).to_numpy()
    compute = table["flops"].to_numpy(dtype=float) / rate
    memory = (table["bytes_read"] + table["bytes_written"]).to_numpy(dtype=float) / target.bandwidth
    fractions = target.fractions or {}
    fc = table["op_class"].map(lambda c: fractions[c].compute if c in fractions else 1.0)
    fm = table["op_class"].map(lambda c: fractions[c].memory if c in fractions else 1.0)
    device = np.maximum(compute / fc.to_numpy(dtype=float), memory / fm.to_numpy(dtype=float))
    if target.fresh_bytes_per_s:  # a CPU: outputs above the mmap threshold are faulted in
        written = table["bytes_written"].to_numpy(dtype=float)
        calls = np.maximum(table["calls"].to_numpy(dtype=float), 1)
        # a row's bytes per call stand for one output: not the optimizer's (its rows merge
        # sizes, its foreach ops take lists) nor attention's (its backward writes dq, dk, dv)
        one = (table["phase"].isin(("forward", "backward"))
               & (table["op_class"] != "attention") & ~table["op"].str.endswith("_")).to_numpy()
        fresh = one & (written / calls >= MMAP_MAX_BYTES)
        device = device + np.where(fresh, written / target.fresh_bytes_per_s, 0.0)
    return compute, memory, device


def queue_ends(device_s: np.ndarray, host_op_s: float) -> np.ndarray:
    """When the device finishes each op of a sequence the host issues back to back, `host_op_s`
    each, never waiting (one stream): end(i) = max(i x host_op_s, end(i-1)) + device(i), that
    is the cumulative device time plus the largest (issue time - device time before) so far."""
    device_s = np.asarray(device_s, dtype=float)
    issued = host_op_s * np.arange(1, len(device_s) + 1)
    done = np.cumsum(device_s)
    return done + np.maximum.accumulate(issued - (done - device_s))


def phase_times(costs, target: Target, tf32: bool = False) -> dict[str, PhaseTime]:
    """phase -> PhaseTime of one step of `costs` (an `OpCosts`) on `target` (see the module).
    Ops are taken in their issue order (`costs.order`), each call at its row's device time per
    call; a phase without an order is taken row by row. On a GPU the whole step is one queue
    (lmperf's bench synchronises once per step and times its phases with events on the GPU's
    timeline): a phase takes from the end of the previous phase's last op to its own last op's,
    so a host-bound phase can start on a backlog the previous one left."""
    table = costs.table.reset_index(drop=True)  # `order` holds row positions
    compute, memory, device = op_times(table, target, tf32)
    ideal = np.maximum(compute, memory)
    calls = table["calls"].to_numpy(dtype=float)
    per_call = np.divide(device, calls, out=np.zeros_like(device), where=calls > 0)
    phases = table.groupby("phase", sort=False).groups.items()
    orders = []
    for phase, rows in phases:
        rows = np.asarray(list(rows))
        order = np.asarray(costs.order.get(phase) or [], dtype=int)
        if len(order) != int(calls[rows].sum()):  # no (or a partial) order: rows back to back
            order = np.repeat(rows, calls[rows].astype(int))
        orders.append(order)
    ends = queue_ends(per_call[np.concatenate(orders)] if orders else [], target.host_op_s)
    out, last, at = {}, 0.0, 0
    for (phase, rows), order in zip(phases, orders):
        rows, n = np.asarray(list(rows)), len(order)
        host, busy = n * target.host_op_s, float(device[rows].sum())
        at += n
        end = float(ends[at - 1]) if n else last
        typical = host + busy if target.synchronous else end - last
        last = end
        nbytes = int((table["bytes_read"].to_numpy()[rows]
                      + table["bytes_written"].to_numpy()[rows]).sum())
        out[phase] = PhaseTime(float(ideal[rows].sum()), typical, busy, host,
                               int(table["flops"].to_numpy()[rows].sum()), nbytes, n)
    return out


def fused(costs):
    """`costs` (an `OpCosts`) as torch.compile runs its step: each maximal run of elementwise
    and norm calls in a phase's issue order is one kernel (one launch) that reads what the run's
    first call that moves bytes reads and writes what its last one writes (its intermediates
    stay in registers: "a fused pointwise chain costs one pass over its inputs and outputs"),
    its FLOPs the run's; matmuls, attention and the optimizer (which torchtitan does not
    compile) unchanged. One row per call of the result; a phase without an issue order stays."""
    from dataclasses import replace

    table = costs.table.reset_index(drop=True)
    calls = np.maximum(table["calls"].to_numpy(dtype=float), 1)
    per = np.stack([table[c].to_numpy(dtype=float) / calls
                    for c in ("flops", "bytes_read", "bytes_written")], axis=1)
    pointwise = (table["op_class"] == "elementwise/norm").to_numpy()
    frames, order, at = [], {}, 0
    for phase, seq in costs.order.items():
        seq = np.asarray(seq, dtype=int)
        if not len(seq):
            continue
        kind = pointwise[seq]
        # a run starts at a pointwise call after a non-pointwise one (or the phase's start);
        # every other call is a group of its own
        new = ~kind | np.concatenate([[True], ~kind[:-1]])
        group = np.cumsum(new) - 1  # (calls,) -> its kernel
        moves = per[seq, 1] + per[seq, 2] > 0
        idx = np.arange(len(seq))
        last = np.full(group[-1] + 1, -1)
        np.maximum.at(last, group[moves], idx[moves])
        first_rev = np.full(group[-1] + 1, len(seq))
        np.minimum.at(first_rev, group[moves], idx[moves])
        lead = np.searchsorted(group, np.arange(group[-1] + 1))  # each kernel's first call
        flops = np.add.reduceat(per[seq, 0], lead)
        has = last >= 0
        read = np.where(has, per[seq[np.minimum(first_rev, len(seq) - 1)], 1], 0.0)
        write = np.where(has, per[seq[np.maximum(last, 0)], 2], 0.0)
        rows = table.iloc[seq[lead]][["phase", "op", "dtype", "op_class"]].reset_index(drop=True)
        runs = kind[lead] & (np.diff(np.append(lead, len(seq))) > 1)
        rows.loc[runs, "op"] = "fused"
        rows["calls"] = 1
        rows["flops"], rows["bytes_read"], rows["bytes_written"] = flops, read, write
        frames.append(rows)
        order[phase] = list(range(at, at + len(rows)))
        at += len(rows)
    unordered = table[~table["phase"].isin(list(order))]
    out = pd.concat(frames + [unordered], ignore_index=True)
    for c in ("flops", "bytes_read", "bytes_written"):
        out[c] = out[c].round().astype("int64")
    return replace(costs, table=out[list(table.columns)], order=order,
                   method=costs.method + "; elementwise runs fused (torch.compile)")
