"""`lmperf dist --estimate`: memory and communication per device for DDP, ZeRO, FSDP, TP and
FSDP x TP on clusters you do not have, for the course's accounting model (analytic rows,
docs/commands/dist.md). A preset LM's rows are `lmperf plan`'s (`lmperf plan --size X --gpus N`)."""

from __future__ import annotations

import bisect
from typing import Callable, Sequence

import pandas as pd

from lmperf.core.report import Report
from lmperf.errors import SpecError
from lmperf.estimate.formulas import Shape, activation_bytes, ffn_only_shape, tp_params
from lmperf.estimate.strategies import DATA_PARALLEL, strategy as strategy_of
from lmperf.units import GIB

PRECISION = "bf16-mixed"  # what every row prices: bf16 autocast over fp32 weights, as plan's
COMM_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
ROLE = {"tp": "single", "fsdp+tp": "fsdp"}  # the plan's strategy of the rows tp and fsdp+tp
ONLY = ("dist --estimate prices only the course's accounting model (--ffn-only --d-model C "
        "--d-ff F --num-layers L); for a preset LM use `lmperf plan --size X --gpus N`")


def estimate(*, world_size: Sequence[int] | int | None = None, d_model: int | None = None,
             d_ff: int | None = None, num_layers: int | None = None, ffn_only: bool = False,
             tokens: int = 2**20, gpu: str | None = None, bandwidth: float | None = None,
             gib: float | None = None, comm_dtype: str = "bf16",
             tp: Sequence[int] | int | None = None, node_bandwidth: float | None = None,
             gpus_per_node: int = 8) -> Report:
    """Memory and communication per device (nothing runs) of the course's accounting model
    (`ffn_only`: `num_layers` blocks of two Linear layers `d_model` x `d_ff`): one row per
    (data-parallel strategy, N in `world_size`, default 8 64 512), a tp row at t = N and an
    fsdp+tp row per degree of `tp` (default 2 4 8), `tokens` per step. The target as `lmperf
    plan` builds it (`gpu`, default H100-SXM, `gpus_per_node`, `gib`); `bandwidth` and
    `node_bandwidth` (GB/s) replace the datasheet's. `comm_dtype` prices the course's column
    `comm_gb`. Raises SpecError for bad input (ONLY without the model)."""
    from lmperf.core.vocabulary import as_list, check_target
    from lmperf.estimate.target import cluster
    from lmperf.validate import choice, positive_int

    sizes, degrees = as_list(world_size) or [8, 64, 512], as_list(tp) or [2, 4, 8]
    check_target(gpu=gpu, gpus=sizes, gpus_per_node=gpus_per_node, gib=gib)
    for t in degrees:
        positive_int("tensor-parallel degree", t)
    for name, value in (("bandwidth", bandwidth), ("node_bandwidth", node_bandwidth)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not value > 0):
            raise SpecError(f"{name} must be a positive number, got {value!r}")
    positive_int("tokens", tokens)
    c_bytes = COMM_BYTES[choice("comm dtype", comm_dtype, COMM_BYTES)]
    explicit = (d_model, d_ff, num_layers)
    if not ffn_only or None in explicit:
        raise SpecError(ONLY)
    for name, v in zip(("d_model", "d_ff", "num_layers"), explicit):
        positive_int(name, v)
    shape = ffn_only_shape(d_model, d_ff, num_layers)
    cards = [cluster(gpu or "H100-SXM", n, gpus_per_node=gpus_per_node, gib=gib,
                     bandwidth=bandwidth, node_bandwidth=node_bandwidth) for n in sizes]
    rows = [r for card in cards for r in _ffn_rows(shape, card, degrees, tokens, c_bytes)]
    card = cards[0]
    caption = (f"{shape.name}, P = {shape.params:,} parameters, {tokens:,} tokens/step, "
               f"{card.name} (link {card.link.intra_gbps:g} GB/s within {gpus_per_node}-GPU "
               f"nodes, {card.budget / GIB:g} GiB); comm_gb in {comm_dtype}; activations: bf16 "
               "block inputs and first-layer outputs of the FFN-only model")
    frame = pd.DataFrame(rows)
    return Report(kind="dist", frame=frame, title=f"lmperf dist --estimate: {caption}",
                  findings=_findings(rows), headline=_headline(frame),
                  answer=("total", "fits"))


def _headline(frame: pd.DataFrame) -> list[str]:
    """Per device count, the strategy whose rank needs the least memory: the answer, first."""
    parts = []
    for n, group in frame.groupby("world_size", sort=False):
        best = group.loc[group["total_gib"].idxmin()]
        parts.append(f"{n}: {best['strategy']} needs the least, {best['total_gib']:.3g} GiB")
    return ["per rank (estimated) on " + "; ".join(parts)]


def _pairs(n: int, degrees: Sequence[int]) -> list[tuple[str, int]]:
    """The (strategy, t) rows of N devices."""
    return [(s, 1) for s in DATA_PARALLEL] + [("tp", n)] + [
        ("fsdp+tp", t) for t in degrees if 1 < t < n and n % t == 0]


def candidate(strategy: str, n: int, t: int):
    """The plan's Candidate of a row of N devices: a data-parallel strategy over all of them,
    `tp` (TP over all N: one replica) or `fsdp+tp` (FSDP over N / t replicas of t-way TP); one
    micro-batch of one sequence (the accounting model prices no step)."""
    from lmperf.estimate.candidate import Candidate
    from lmperf.estimate.layout import Layout

    name = ROLE.get(strategy, strategy)
    layout = Layout(n, tp=t, dp_replicate=n // t if name == "ddp" else 1)
    return Candidate(PRECISION, 0, name, layout, 1, 1)


def _states(shape: Shape, strategy: str, n: int, t: int) -> float:
    """Model-state bytes a rank holds: fp32 weights 4, gradients 4 and AdamW's moments 8 per
    parameter it keeps (P_t under t-way TP; 1/d of the categories the strategy shards)."""
    d, shards = n // t, strategy_of(ROLE.get(strategy, strategy)).shards
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
        states = _states(shape, strategy, card.gpus, t)
        saved = activation_bytes(shape, tokens // d, t)
        c = candidate(strategy, card.gpus, t)
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
    """Per data-parallel strategy: the fewest devices whose rank fits (not counted for the TP
    rows, whose degree is the row's)."""
    out, seen = [], set()
    for row in rows:
        if row["tp"] != 1 or row["strategy"] in seen:
            continue
        seen.add(row["strategy"])
        fewest = row["min_devices"]
        out.append(f"{row['strategy']}: a rank fits with "
                   + (f">= {fewest} device(s)" if fewest else "no number of devices"))
    return out
