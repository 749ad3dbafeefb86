"""`lmperf dist --estimate`: memory, time and communication per device for DDP, ZeRO, FSDP, TP and
FSDP x TP on clusters you do not have; each row of a preset is `lmperf plan`'s prediction of that
configuration, the course's accounting model's rows are analytic (docs/commands/dist.md)."""

from __future__ import annotations

import bisect
import math
from typing import Callable, Sequence

import pandas as pd

from lmperf.core.report import Report
from lmperf.errors import SpecError
from lmperf.estimate.formulas import Shape, activation_bytes, ffn_only_shape, tp_params
from lmperf.estimate.strategies import DATA_PARALLEL, strategy as strategy_of
from lmperf.units import GIB

PRECISION = "bf16-mixed"  # what every row prices: bf16 autocast over fp32 weights, as plan's
COMM_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def estimate(*, world_size: Sequence[int] | int | None = None, size: str | None = None,
             context: int | None = None, course: str | None = None, batch: int | None = None,
             d_model: int | None = None, d_ff: int | None = None, num_layers: int | None = None,
             ffn_only: bool = False, tokens: int = 2**20, gpu: str | None = None,
             bandwidth: float | None = None, gib: float | None = None,
             tflops: float | None = None, comm_dtype: str = "bf16",
             tp: Sequence[int] | int | None = None, node_bandwidth: float | None = None,
             gpus_per_node: int = 8, host_us: float | None = None) -> Report:
    """Memory, time and communication per device (nothing runs): one row per (data-parallel
    strategy, N in `world_size`, default 8 64 512), a tp row at t = N and an fsdp+tp row per
    degree of `tp` (default 2 4 8). The model: a preset `size` of `course` (default xl) at
    `context` (default 1024), or with `ffn_only` the course's accounting model of `d_model` x
    `d_ff` x `num_layers`; `tokens` per step in micro-batches of `batch` sequences per replica
    (default 1; 0: model states only). The target as `lmperf plan` builds it (`gpu`, default
    H100-SXM, `gpus_per_node`, `gib`, `host_us`); `bandwidth`, `node_bandwidth` (GB/s) and
    `tflops` replace the datasheet's. `comm_dtype` prices the course's column `comm_gb`. Raises
    SpecError for bad input."""
    from lmperf.core.vocabulary import as_list, check_target
    from lmperf.estimate.target import cluster
    from lmperf.model.presets import DEFAULT_COURSE
    from lmperf.validate import choice, non_negative_int, positive_int

    sizes, degrees = as_list(world_size) or [8, 64, 512], as_list(tp) or [2, 4, 8]
    check_target(gpu=gpu, gpus=sizes, gpus_per_node=gpus_per_node, gib=gib, host_us=host_us)
    for t in degrees:
        positive_int("tensor-parallel degree", t)
    for name, value in (("bandwidth", bandwidth), ("tflops", tflops),
                        ("node_bandwidth", node_bandwidth)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not value > 0):
            raise SpecError(f"{name} must be a positive number, got {value!r}")
    positive_int("tokens", tokens)
    batch = non_negative_int("batch", 1 if batch is None else batch)
    c_bytes = COMM_BYTES[choice("comm dtype", comm_dtype, COMM_BYTES)]
    context = context or 1024

    def target(n: int):
        return cluster(gpu or "H100-SXM", n, gpus_per_node=gpus_per_node, gib=gib,
                       host_us=host_us, bandwidth=bandwidth, node_bandwidth=node_bandwidth,
                       tflops=tflops)

    explicit = (d_model, d_ff, num_layers)
    if ffn_only or any(v is not None for v in explicit):
        if None in explicit or not ffn_only:
            raise SpecError("give all of --d-model, --d-ff and --num-layers with --ffn-only (or "
                            "a --size preset for the LM)")
        for name, v in zip(("d_model", "d_ff", "num_layers"), explicit):
            positive_int(name, v)
        shape = ffn_only_shape(d_model, d_ff, num_layers)
        rows = [r for n in sizes for r in _ffn_rows(shape, target(n), degrees, tokens, c_bytes)]
        said = "activations: bf16 block inputs and first-layer outputs of the FFN-only model"
    else:
        rows, shape, said = _lm_rows(size or "xl", course or DEFAULT_COURSE, context, batch,
                                     tokens, sizes, degrees, target, c_bytes)
    card = target(sizes[0])
    caption = (f"{shape.name}, P = {shape.params:,} parameters, {tokens:,} tokens/step, "
               f"{card.name} (link {card.link.intra_gbps:g} GB/s within {gpus_per_node}-GPU "
               f"nodes, {card.budget / GIB:g} GiB, dense bf16 "
               f"{card.target.flops_per_s['bf16'] / 1e12:g} TFLOP/s, host "
               f"{card.target.host_op_s * 1e6:g} us/op); comm_gb in {comm_dtype}; {said}")
    frame = pd.DataFrame(rows)
    return Report(kind="dist", frame=frame, title=f"lmperf dist --estimate: {caption}",
                  findings=_findings(rows), headline=_headline(frame, card.name),
                  answer=("total", "fits", "step (ms)"))


def _headline(frame: pd.DataFrame, gpu: str) -> list[str]:
    """Per device count, the fastest configuration that fits (or the smallest need), with its
    step and per-rank memory: the answer, first."""
    parts = []
    if "step_ms" not in frame:  # the accounting model: memory and communication only
        for n, group in frame.groupby("world_size", sort=False):
            best = group.loc[group["total_gib"].idxmin()]
            parts.append(f"{n}: {best['strategy']} needs the least, {best['total_gib']:.3g} GiB")
        return ["per rank (estimated) on " + "; ".join(parts)]
    for n, group in frame.groupby("world_size", sort=False):
        fit = group[group["fits"] == True]  # noqa: E712 (None: no budget)
        if fit.empty:
            best = group.loc[group["total_gib"].idxmin()]
            parts.append(f"{n}: none fits (least {best['total_gib']:.3g} GiB per rank, "
                         f"{best['strategy']})")
            continue
        best = fit.loc[fit["step_ms"].idxmin()]
        name = best["strategy"] + (f" t={best['tp']}" if best["strategy"] == "fsdp+tp" else "")
        parts.append(f"{n}: {name} {best['step_ms'] / 1e3:.3g} s per step, "
                     f"{best['total_gib']:.3g} GiB per rank")
    return [f"fastest that fits (estimated) on {gpu} x " + "; x ".join(parts)]


def _pairs(n: int, degrees: Sequence[int]) -> list[tuple[str, int]]:
    """The (strategy, t) rows of N devices."""
    return [(s, 1) for s in DATA_PARALLEL] + [("tp", n)] + [
        ("fsdp+tp", t) for t in degrees if 1 < t < n and n % t == 0]


def _lm_rows(size, course, context, batch, tokens, sizes, degrees, target, c_bytes):
    """The rows of a preset LM, each `lmperf plan`'s prediction of that configuration."""
    from lmperf.estimate.fit import Workload, fits, rank_peak, timelines
    from lmperf.estimate.fit import shape_of
    from lmperf.estimate.step_time import step_time

    work = Workload(size, course, None, context, "sdpa", "cuda")
    spec, counted = work.spec(1, "fp32"), shape_of(work)
    shape = Shape(f"{size} ({course}: {spec.shape()})", counted.params, counted.d_model,
                  counted.d_ff, counted.num_layers, counted.num_heads, counted.vocab_size,
                  num_kv_heads=spec.num_kv_heads or 0, numels=counted.numels)
    if tokens % context:
        raise SpecError(f"--tokens {tokens} is not a whole number of {context}-token sequences")
    sequences, b = tokens // context, max(batch, 1)
    lines = timelines(work, PRECISION, "none") if batch else None

    def memory(strategy: str, n: int, t: int, accum: int) -> tuple[float, float, float]:
        """(model states, peak, allowance) of one rank, in bytes."""
        states = _states(shape, strategy, n, t)
        if lines is None:  # --batch 0: the model states, nothing else
            return states, states, 0.0
        return (states, *rank_peak(lines, shape, candidate(strategy, n, t, b, accum), context,
                                   "cuda"))

    def evaluate(strategy: str, n: int, t: int) -> dict | None:
        d = n // t
        if sequences % d or sequences // d < b:
            return None
        card, accum = target(n), math.ceil(sequences // d / b)
        try:
            c = candidate(strategy, n, t, b, accum)
            c.layout.check(num_layers=shape.num_layers, num_heads=shape.num_heads,
                           num_kv_heads=shape.num_kv_heads or None, context=context,
                           global_batch=sequences)
        except SpecError:  # TP cannot split this model's heads by t
            return None
        x = step_time(c, work, shape, card, sequences)
        states, peak, allowance = memory(strategy, n, t, accum)
        compute = x["compute_s"] + x["optimizer_s"]
        return {"strategy": strategy, "world_size": n, "tp": t, "dp": d, "params": shape.params,
                "memory_method": "simulated" if lines is not None else "states",
                "states_gib": states / GIB, "activations_gib": (peak - states) / GIB,
                "allowance_gib": allowance / GIB, "total_gib": (peak + allowance) / GIB,
                "fits": fits(peak + allowance, card.budget), "micro_batch": b,
                "grad_accum": accum, "tflop": x["flops"] / 1e12,
                "comm_gb": x["sent_elements"] * c_bytes / 1e9, "comm_ms": x["comm_s"] * 1e3,
                "exposed_comm_ms": x["exposed_comm_s"] * 1e3, "compute_ms": compute * 1e3,
                "step_ms": x["step_s"] * 1e3, "comm_bound": x["comm_s"] > compute}

    def fewest(strategy: str, t: int) -> int | None:
        """The fewest devices (tp: the smallest t) whose rank fits the step."""
        def ok(n: int, t: int) -> bool:
            accum = math.ceil(math.ceil(sequences / (n // t)) / b)
            return bool(fits(sum(memory(strategy, n, t, accum)[1:]), target(n).budget))

        if strategy == "tp":
            return _fewest(lambda k: ok(k, k), shape.num_heads, 2)
        k = _fewest(lambda k: ok(k * t, t), sequences, 2 if t == 1 else 1)
        return None if k is None else k * t

    def largest(strategy: str, t: int) -> int | None:
        """The largest power-of-two degree (tp: t) at which communication stays below compute."""
        degrees_ok = [k * (1 if strategy == "tp" else t) for k in (2**i for i in range(
            int(math.log2(sequences)) + 1)) if (row := evaluate(
                strategy, k if strategy == "tp" else k * t, k if strategy == "tp" else t))
            and not row["comm_bound"]]
        return max(degrees_ok, default=None)

    rows, found = [], {}
    for n in sizes:
        for strategy, t in _pairs(n, degrees):
            row = evaluate(strategy, n, t)
            if row is not None:
                key = (strategy, 1 if strategy == "tp" else t)
                found.setdefault(key, (fewest(strategy, t), largest(strategy, t)))
                rows.append({**row, "min_devices": found[key][0],
                             "largest_n_compute_bound": found[key][1]})
    return rows, shape, (f"micro-batches of {b} x {context} tokens per replica, bf16 autocast, "
                         "fused attention; memory: the simulated step at a rank's share + the "
                         "CUDA allowance (as `lmperf plan`)" if batch else
                         "memory: model states only (--batch 0)")


def candidate(strategy: str, n: int, t: int, b: int, accum: int):
    """The plan's Candidate of a row of N devices: a data-parallel strategy over all of them,
    `tp` (TP over all N: one replica) or `fsdp+tp` (FSDP over N / t replicas of t-way TP)."""
    from lmperf.estimate.candidate import Candidate
    from lmperf.estimate.layout import Layout

    name = {"tp": "single", "fsdp+tp": "fsdp" if n > t else "single"}.get(strategy, strategy)
    layout = Layout(n, tp=t, dp_replicate=n // t if name == "ddp" else 1)
    return Candidate(PRECISION, 0, name, layout, b, accum)


def _states(shape: Shape, strategy: str, n: int, t: int) -> float:
    """Model-state bytes a rank holds: fp32 weights 4, gradients 4 and AdamW's moments 8 per
    parameter it keeps (P_t under t-way TP; 1/d of the categories the strategy shards)."""
    d, shards = n // t, strategy_of({"tp": "single", "fsdp+tp": "fsdp"}.get(strategy,
                                                                            strategy)).shards
    return sum(tp_params(shape, t) * per / (d if cat in shards else 1) for cat, per in
               (("parameters", 4), ("gradients", 4), ("optimizer state", 8)))


def _ffn_rows(shape: Shape, card, degrees: Sequence[int], tokens: int, c_bytes: int) -> list[dict]:
    """The course's accounting model: states and activations analytic, communication from the
    strategy table at the collective model (no ops to count: no compute or step time)."""
    from lmperf.estimate.fit import fits
    from lmperf.estimate.communication import communication

    rows = []
    for strategy, t in _pairs(card.gpus, degrees):
        d = card.gpus // t
        states, saved = _states(shape, strategy, card.gpus, t), activation_bytes(shape, tokens // d, t)
        c = candidate(strategy, card.gpus, t, 1, 1)
        total, _, sent = communication(c, shape, card, tokens // d, [1], [(0.0, 0.0, 0.0)])
        rows.append({"strategy": strategy, "world_size": card.gpus, "tp": t, "dp": d,
                     "params": shape.params, "memory_method": "analytic",
                     "states_gib": states / GIB, "activations_gib": saved / GIB,
                     "allowance_gib": 0.0, "total_gib": (states + saved) / GIB,
                     "fits": fits(states + saved, card.budget),
                     "min_devices": _fewest(lambda k: _states(shape, strategy, k * t, t)
                                            <= card.budget, 2**20, 2) if t == 1 else None,
                     "comm_gb": sent * c_bytes / 1e9, "comm_ms": total * 1e3})
    return rows


def _fewest(fits: Callable[[int], bool | None], cap: int, start: int = 1) -> int | None:
    """The fewest k in start..cap with fits(k), by bisection (a rank's memory only shrinks as k
    grows); None if not even `cap` fits. Data-parallel strategies start at 2 devices (one
    device is no strategy: no buckets, no shards)."""
    if cap < start or not fits(cap):
        return None
    return start + bisect.bisect_left(range(start, cap + 1), True, key=lambda k: bool(fits(k)))


def _findings(rows: list[dict]) -> list[str]:
    """Per strategy (fsdp+tp per TP degree): the fewest devices and the largest degree."""
    out, seen = [], set()
    for row in rows:
        strategy, t = row["strategy"], row["tp"] if row["strategy"] == "fsdp+tp" else 0
        if (strategy, t) in seen:
            continue
        seen.add((strategy, t))
        fewest, degree = row.get("min_devices"), "t" if strategy == "tp" else "N"
        line = (f"{f'fsdp+tp (t = {t})' if t else strategy}: a rank fits with "
                + (f">= {fewest} device(s)" if fewest else "no number of devices"))
        if "largest_n_compute_bound" in row:
            largest = row["largest_n_compute_bound"]
            line += "; communication stays below compute " + (
                f"up to {degree} = {largest}" if largest else "at no degree")
        out.append(line)
    return out
