"""`lmperf dist --estimate`: memory, FLOPs and communication per device on clusters you do not have.

Every number is a hand-checkable closed form over P parameters, N devices (t tensor-parallel, d
= N / t data-parallel), W GB/s per device and direction, C TFLOP/s per device, c bytes per
communicated element and G tokens per step: model states 16 bytes per parameter held (ZeRO-1,
ZeRO-2 and FSDP shard 8, 12 and 16 of them by N; TP holds P_t), bytes each device sends on a
ring (lmperf.estimate.formulas), communication time = bytes / W with nothing overlapped (a group
spanning more than a node runs at the network's W), compute = 6 P G / (N C). The largest degree
before communication exceeds compute is found by bisection. A row's memory is a simulated rank's
peak (lmperf.estimate.fit, one micro-batch's activations by default) plus the CUDA allowance, or
the analytic states (and the FFN-only model's activations). The table of formulas, with the
course's accounting model worked through: docs/commands/dist.md, "--estimate".
"""

from __future__ import annotations

from typing import Callable

import pandas as pd

from lmperf.core.report import Report
from lmperf.errors import SpecError
from lmperf.estimate.comm import Link
from lmperf.estimate.formulas import (STATE_BYTES, Shape, activation_bytes,
                                                ffn_only_shape, step_flops, tp_comm_bytes,
                                                tp_params)

__all__ = ["Shape", "ffn_only_shape", "estimate_rows", "estimate_report", "preset_shape",
           "device_figures", "state_bytes", "comm_bytes", "largest_n", "largest_tp",
           "largest_n_2d", "tp_step_seconds", "Link", "STRATEGIES"]

GIB = 2**30
GB = 1e9

# strategy -> model-state bytes per device for P parameters and N devices
_STATE_BYTES = {
    "ddp": lambda p, n: 16 * p,
    "zero1": lambda p, n: 8 * p + 8 * p / n,
    "zero2": lambda p, n: 4 * p + 12 * p / n,
    "fsdp": lambda p, n: 16 * p / n,
}
# strategy -> bytes sent per device per step, for S communicated bytes and N devices
_COMM_BYTES = {
    "ddp": lambda s, n: 2 * (n - 1) / n * s,
    "zero1": lambda s, n: 2 * (n - 1) / n * s,
    "zero1-ar-bcast": lambda s, n: 2 * (n - 1) / n * s + (s if n > 1 else 0),
    "zero2": lambda s, n: 2 * (n - 1) / n * s,
    "fsdp": lambda s, n: 3 * (n - 1) / n * s,
}
DATA_PARALLEL: tuple[str, ...] = tuple(_COMM_BYTES)
STRATEGIES: tuple[str, ...] = DATA_PARALLEL + ("tp", "fsdp+tp")


def state_bytes(strategy: str, params: float, n: int) -> float:
    """Model-state bytes per device of a data-parallel strategy (see the module docstring);
    zero1-ar-bcast holds zero1's."""
    return _STATE_BYTES["zero1" if strategy == "zero1-ar-bcast" else strategy](params, n)


def comm_bytes(strategy: str, params: float, n: int, comm_dtype_bytes: int) -> float:
    """Bytes each device of a data-parallel strategy sends per step (see the module docstring)."""
    return _COMM_BYTES[strategy](params * comm_dtype_bytes, n)


def compute_seconds(params: int, tokens_per_device: float, tflops: float) -> float:
    """6 P tokens / C: forward (2 P per token) + backward (4 P per token) at C TFLOP/s."""
    return step_flops(params, tokens_per_device) / (tflops * 1e12)


def _largest(ok: Callable[[int], bool], cap: int = 2**24) -> int | None:
    """The largest degree k >= 2 with ok(k), for ok true up to some k and false after; None if
    ok(2) is false, `cap` if ok(cap)."""
    if not ok(2):
        return None
    if ok(cap):
        return cap
    lo, hi = 2, cap
    while hi - lo > 1:  # ok(lo) and not ok(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def _links(bandwidth: float | Link) -> Link:
    return bandwidth if isinstance(bandwidth, Link) else Link(float(bandwidth))


def _seconds(links: Link, nbytes: float, span: int) -> float:
    """Bytes / W of the slowest link a group spanning `span` devices crosses (no latency: the
    course's accounting; `estimate.comm.collective_seconds` adds it)."""
    return nbytes / (links.gbps(span) * GB)


def largest_n(strategy: str, params: int, global_tokens: int, bandwidth_gbps: float | Link,
              tflops: float, comm_dtype_bytes: int, cap: int = 2**24) -> int | None:
    """The largest N at which a data-parallel strategy's communication time <= its compute time
    per step, with the global batch fixed; None if even N = 2 is communication-bound; `cap` if
    never within it."""
    links = _links(bandwidth_gbps)

    def ok(n: int) -> bool:
        comm = _seconds(links, comm_bytes(strategy, params, n, comm_dtype_bytes), n)
        return comm <= compute_seconds(params, global_tokens / n, tflops)

    return _largest(ok, cap)


def tp_step_bytes(shape: Shape, n: int, t: int, global_tokens: int, c: int) -> float:
    """Bytes each device of a d x t FSDP x TP mesh (d = n / t) sends per step: FSDP's gathers
    and reduce-scatter of its TP shard over d, TP's all-reduces of its replica's G / d tokens
    over t (d = 1 is plain tensor parallelism)."""
    return sum(_tp_parts(shape, n, t, global_tokens, c))


def _tp_parts(shape: Shape, n: int, t: int, global_tokens: int, c: int) -> tuple[float, float]:
    """(FSDP's bytes over d, TP's bytes over t) of tp_step_bytes."""
    d = n // t
    return 3 * (d - 1) / d * c * tp_params(shape, t), tp_comm_bytes(shape, global_tokens / d, t, c)


def tp_step_seconds(shape: Shape, n: int, t: int, global_tokens: int, c: int,
                    links: float | Link) -> float:
    """Communication time per step of a d x t mesh: TP's groups are t consecutive devices (inside
    a node when t <= per_node), FSDP's groups take every t-th device, so they span all N."""
    links = _links(links)
    fsdp, tp = _tp_parts(shape, n, t, global_tokens, c)
    return _seconds(links, fsdp, n) + _seconds(links, tp, t)


def largest_tp(shape: Shape, global_tokens: int, bandwidth_gbps: float | Link, tflops: float,
               c: int, cap: int = 2**24) -> int | None:
    """The largest t at which plain tensor parallelism's communication time <= its compute time
    per step. G cancels out: (4 L + 2) 2 (t-1) C c / W <= 6 P / C_flops."""
    def ok(t: int) -> bool:
        comm = tp_step_seconds(shape, t, t, global_tokens, c, bandwidth_gbps)
        return comm <= compute_seconds(shape.params, global_tokens / t, tflops)

    return _largest(ok, cap)


def largest_n_2d(shape: Shape, t: int, global_tokens: int, bandwidth_gbps: float | Link,
                 tflops: float, c: int, cap: int = 2**24) -> int | None:
    """The largest N = d t (d >= 2) at which FSDP x TP with TP degree `t` stays compute-bound;
    None if d = 2 is already communication-bound."""
    def ok(d: int) -> bool:
        comm = tp_step_seconds(shape, d * t, t, global_tokens, c, bandwidth_gbps)
        return comm <= compute_seconds(shape.params, global_tokens / (d * t), tflops)

    d = _largest(ok, cap)
    return None if d is None else d * t


def _fewest(fits: Callable[[int], bool], cap: int = 2**16) -> int | None:
    """The fewest devices k with fits(k), for fits false up to some k and true after (a rank's
    memory only shrinks as k grows); None if not even `cap` fits."""
    if fits(1):
        return 1
    last = _largest(lambda k: not fits(k), cap)  # the most devices that still do not fit
    return 2 if last is None else None if last == cap else last + 1


def _row(strategy: str, shape: Shape, n: int, t: int, states: float, activations: float,
         sent: float, comm_s: float, *, gpu_gib: float, tflops: float, global_tokens: int,
         fewest: int | None, largest: int | None, allowance: float = 0.0,
         method: str = "analytic") -> dict:
    flops = step_flops(shape.params, global_tokens / n)
    compute_s = flops / (tflops * 1e12)
    total = states + activations + allowance
    return {"strategy": strategy, "world_size": n, "tp": t, "dp": n // t, "params": shape.params,
            "memory_method": method, "states_gib": states / GIB,
            "activations_gib": activations / GIB, "allowance_gib": allowance / GIB,
            "total_gib": total / GIB, "fits": total <= gpu_gib * GIB,
            "min_devices_states": fewest, "tflop": flops / 1e12, "comm_gb": sent / GB,
            "comm_ms": comm_s * 1e3, "compute_ms": compute_s * 1e3, "comm_bound": comm_s > compute_s,
            "largest_n_compute_bound": largest}


def estimate_rows(shape: Shape, world_sizes: list[int], *, bandwidth_gbps: float | Link,
                  gpu_gib: float, tflops: float, global_tokens: int, comm_dtype_bytes: int,
                  tp_degrees: tuple[int, ...] = (2, 4, 8),
                  micro_tokens: int | None = None,
                  rank_memory: Callable[[str, int, int], tuple[float, float]] | None = None,
                  allowance: Callable[[float], float] | None = None) -> list[dict]:
    """One row per (strategy, N), plus a tp row per N and an fsdp+tp row per TP degree that
    divides N (1 < t < N): memory per device and whether it fits, FLOPs, communication and
    compute per step, and the largest degree before communication dominates.

    Activations: with `micro_tokens` (tokens of one micro-batch per data-parallel replica, an LM
    preset) those of that micro-batch; for the FFN-only model those of all G / d tokens of a
    replica (the course's accounting); else none (model states only). `rank_memory(strategy,
    N, t)`, when given, replaces a row's analytic (states, activations) by a simulated rank's
    (states, everything else) at its peak (lmperf.estimate.fit);
    `allowance(bytes)` adds what a simulation cannot see (the CUDA context, ...)."""
    c = comm_dtype_bytes
    links = _links(bandwidth_gbps)
    common = dict(gpu_gib=gpu_gib, tflops=tflops, global_tokens=global_tokens)

    def saved(d: int, t: int) -> float:
        if micro_tokens is not None:
            return activation_bytes(shape, micro_tokens, t)
        return activation_bytes(shape, global_tokens // d, t) if shape.ffn_only else 0.0

    def memory(strategy: str, n: int, t: int, states: float, activations: float) -> dict:
        method = "analytic"
        if rank_memory is not None:
            (states, activations), method = rank_memory(strategy, n, t), "simulated"
        extra = allowance(states + activations) if allowance else 0.0
        return dict(states=states, activations=activations, allowance=extra, method=method)

    def fewest(strategy: str, t: int = 1) -> int | None:
        """The fewest devices that hold a rank's memory (simulated) or model states (analytic;
        tp: the fewest t, fsdp+tp: the fewest N = d t at this t)."""
        budget = gpu_gib * GIB
        if rank_memory is not None and t == 1 and strategy != "tp":
            return _fewest(lambda k: sum(memory(strategy, k, 1, 0, 0)[x] for x in (
                "states", "activations", "allowance")) <= budget)
        if strategy == "tp":
            return _fewest(lambda k: STATE_BYTES * tp_params(shape, k) <= budget)
        if strategy == "fsdp+tp":
            d = _fewest(lambda k: STATE_BYTES * tp_params(shape, t) / k <= budget)
            return None if d is None else d * t
        return _fewest(lambda k: state_bytes(strategy, shape.params, k) <= budget)

    rows = []
    for n in world_sizes:
        for strategy in DATA_PARALLEL:
            sent = comm_bytes(strategy, shape.params, n, c)
            rows.append(_row(
                strategy, shape, n, 1, sent=sent, comm_s=_seconds(links, sent, n),
                fewest=fewest(strategy),
                largest=largest_n(strategy, shape.params, global_tokens, links, tflops, c),
                **memory(strategy, n, 1, state_bytes(strategy, shape.params, n), saved(n, 1)),
                **common))
        rows.append(_row(
            "tp", shape, n, n, **memory("tp", n, n, STATE_BYTES * tp_params(shape, n), saved(1, n)),
            sent=tp_step_bytes(shape, n, n, global_tokens, c),
            comm_s=tp_step_seconds(shape, n, n, global_tokens, c, links),
            fewest=fewest("tp"),
            largest=largest_tp(shape, global_tokens, links, tflops, c), **common))
        for t in tp_degrees:
            if 1 < t < n and n % t == 0:
                rows.append(_row(
                    "fsdp+tp", shape, n, t,
                    **memory("fsdp+tp", n, t, STATE_BYTES * tp_params(shape, t) / (n // t),
                             saved(n // t, t)),
                    sent=tp_step_bytes(shape, n, t, global_tokens, c),
                    comm_s=tp_step_seconds(shape, n, t, global_tokens, c, links),
                    fewest=fewest("fsdp+tp", t),
                    largest=largest_n_2d(shape, t, global_tokens, links, tflops, c),
                    **common))
    return rows


def preset_shape(size: str | None, course: str | None, context: int | None) -> Shape:
    """The Shape of a preset LM of the `course` edition's table (default xl); `context` only
    checks the preset allows it (P does not depend on it)."""
    from lmperf.model.presets import DEFAULT_COURSE
    from lmperf.questions.memory.estimate import param_count
    from lmperf.workload.spec import RunSpec

    spec = RunSpec.from_size(size or "xl", course or DEFAULT_COURSE,
                             context=context or 1024)
    shape = spec.shape() + ("" if "V=" in spec.shape() else f" V={spec.vocab_size}")
    return Shape(f"{spec.size} ({spec.course}: {shape})", param_count(spec.model_config()),
                 spec.d_model, spec.d_ff, spec.num_layers, spec.num_heads, spec.vocab_size,
                 num_kv_heads=spec.num_kv_heads or 0)


def device_figures(gpu: str | None, bandwidth: float | None, gpu_gib: float | None,
                   tflops: float | None) -> tuple[float, float, float, str]:
    """(W GB/s, memory GiB, C TFLOP/s, what they are) from `--gpu NAME`'s datasheet where not
    given: W its link bandwidth per direction, memory its capacity, C its dense bf16 peak (fp16
    where it has no bf16); without a GPU, 100 GB/s, 80 GiB and 400 TFLOP/s. SpecError for an
    unknown GPU, or one without a published peak when `tflops` is not given."""
    from lmperf.runtime.peaks import require_device

    if gpu is None:
        w, m, c = bandwidth or 100.0, gpu_gib or 80.0, tflops or 400.0
        return w, m, c, f"W = {w:g} GB/s, C = {c:g} TFLOP/s, {m:g} GiB per device"
    spec = require_device(gpu)
    peak_dtype = "bf16" if spec.peak_tflops("bf16") else "fp16"
    peak = spec.peak_tflops(peak_dtype)
    if tflops is None and peak is None:
        raise SpecError(f"{spec.name} has no published dense peak: give --tflops")
    w = bandwidth or spec.link_bandwidth / GB
    m = gpu_gib or spec.memory_gib
    c = tflops or peak
    said = [f"W = {w:g} GB/s" + ("" if bandwidth else f" per direction ({spec.interconnect})"),
            f"C = {c:g} TFLOP/s" + ("" if tflops else f" (dense {peak_dtype} peak, not achieved)"),
            f"{m:g} GiB per device" + ("" if gpu_gib else " (datasheet; CUDA reports a little less)")]
    return w, m, c, f"{spec.name}: " + ", ".join(said)


def estimate_report(rows: list[dict], caption: str) -> Report:
    """The Report of `--estimate` (no records: nothing ran)."""
    frame = pd.DataFrame(rows)
    return Report(kind="dist", frame=frame, title=f"lmperf dist --estimate: {caption}",
                  findings=_findings(frame))


def _findings(df: pd.DataFrame) -> list[str]:
    """Per strategy (fsdp+tp per TP degree): the fewest devices and the largest degree."""
    out = []
    two_d = df["strategy"] == "fsdp+tp"
    for (strategy, t), group in df.groupby(["strategy", df["tp"].where(two_d, 0)], sort=False):
        row = group.iloc[0]
        name = f"fsdp+tp (t = {t})" if strategy == "fsdp+tp" else strategy
        fewest, largest = row["min_devices_states"], row["largest_n_compute_bound"]
        degree = "t" if strategy == "tp" else "N"
        smallest = f"N = {2 * t} (d = 2)" if strategy == "fsdp+tp" else f"{degree} = 2"
        what = "model states fit" if row["memory_method"] == "analytic" or strategy in (
            "tp", "fsdp+tp") else "a rank's memory (activations included) fits"
        out.append(f"{name}: {what} with "
                   + (f">= {int(fewest)} device(s)" if _known(fewest) else "no number of devices")
                   + "; communication stays below compute "
                   + (f"up to {degree} = {int(largest)}" if _known(largest)
                      else f"at no degree (already above it at {smallest})"))
    return out


def _known(value: object) -> bool:
    return value is not None and value == value  # not None, not NaN
