"""The fastest configuration that fits: a search over layouts (data-parallel replicate x shard,
tensor, pipeline, context) x strategy x precision x checkpointing x micro-batch, each
candidate's per-rank peak simulated (`estimate.fit`) and its step predicted (`step_time`: the
op counts of one rank on the target, the pipeline's bubble, the strategy table's collectives).
What is left out is said, with its reason. How each number is made: docs/commands/plan.md."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Callable

from lmperf.errors import SpecError
from lmperf.estimate.candidate import Candidate
from lmperf.estimate.fit import PRECISIONS, Workload, fits, rank_peak, rank_shares, timelines
from lmperf.estimate.formulas import Shape, bus_factor
from lmperf.estimate.layout import LOOPED, Layout, LayoutError
from lmperf.estimate.strategies import BUCKET_BYTES, DATA_PARALLEL, collectives, strategy
from lmperf.estimate.target import GIB, Cluster
from lmperf.names import PP_SCHEDULES

Progress = Callable[[int, int, str], None]  # (done, total, what is being done)
LONG_CONTEXT = 16384  # context parallelism is searched from here (below, attention is cheap)


@dataclass(frozen=True)
class Space:
    """What a search covers: each dimension's values (None: every value that applies). The
    flags of the shared vocabulary, one value each to evaluate one configuration."""

    precisions: tuple[str, ...]
    checkpoints: tuple[str | int, ...] = ("none", "op", "full")
    strategies: tuple[str, ...] | None = None
    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    dp_replicate: tuple[int, ...] | None = None
    pp_schedule: tuple[str, ...] | None = None
    pp_virtual: tuple[int, ...] | None = None
    micro_batch: tuple[int, ...] | None = None
    async_tp: tuple[bool, ...] | None = None
    compile: tuple[bool, ...] | None = None
    float8: tuple[str, ...] | None = None


def shape_of(work: Workload) -> Shape:
    """The Shape (parameters counted on a meta model, widths from the config) of `work`."""
    import torch

    from lmperf.model.custom import build_model

    spec = work.spec(1, "fp32")
    config = spec.model_config()
    with torch.device("meta"):
        model = build_model(config, spec.model)
    numels = tuple(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    return Shape(spec.model or spec.size, sum(numels), config.d_model, config.d_ff,
                 config.num_layers, config.num_heads, config.vocab_size,
                 num_kv_heads=config.num_kv_heads or 0, numels=numels)


# --- time -------------------------------------------------------------------------------------
@lru_cache(maxsize=2048)
def phases(work: Workload, precision: str, batch: int, target, t: int = 1, cp: int = 1,
           layers: int | None = None, compile: bool = False,
           float8: str = "none") -> tuple[dict, int]:
    """(phase -> predicted seconds, forward + backward FLOPs) of one micro-batch of `batch`
    sequences on one device of `target`, as one rank of `t`-way tensor and `cp`-way context
    parallelism runs it, for the model at `layers` blocks (None: its own). Sequence and tensor
    parallelism split every op's work t ways (the matmuls by Megatron's plan, the rest by
    sequence) and the rank still issues every op; context parallelism runs the step at T / cp
    tokens, its attention against the whole sequence (x cp of attention at T / cp). `compile`:
    torch.compile's fused elementwise runs (`time_model.fused`); `float8`: the blocks' Linear
    layers in float8 (`_float8`). Cached by value: a Target is frozen and compares by its
    figures."""
    from lmperf.estimate.time_model import fused, op_times, phase_times

    costs = _counted(work, precision, batch, layers)
    if t > 1 or cp > 1:
        table = costs.table.copy()
        share = table["op_class"].map(lambda c: cp / t if c == "attention" else 1 / t)
        for column in ("flops", "bytes_read", "bytes_written"):
            table[column] = (table[column] * share).round().astype("int64")
        costs = replace(costs, table=table)
    if compile:
        costs = fused(costs)
    casts: dict[str, float] = {}
    if float8 != "none":
        head = batch * work.context * work.spec(1, "fp32").vocab_size * 2 / t
        costs, casts = _float8(costs, target, head, compile)
    table = costs.table
    times = {p: x.typical_s + casts.get(p, 0.0) for p, x in phase_times(costs, target).items()}
    # the matmuls' own device time per phase (what async TP can hide TP's collectives behind),
    # the forward's elementwise ops' (what `op` checkpointing recomputes with some matmuls)
    _, _, device = op_times(table, target)
    for p in ("forward", "backward"):
        for kind in ("matmul", "elementwise/norm"):
            rows = ((table["phase"] == p) & (table["op_class"] == kind)).to_numpy()
            times[f"{kind.split('/')[0]} {p}"] = float(device[rows].sum())
    return times, int(table.loc[table["phase"].isin(("forward", "backward")), "flops"].sum())


def _float8(costs, target, head: float, compiled: bool):
    """(`costs` with the blocks' Linear layers in float8, as torchao trains them, seconds of
    casting per phase). Each of their forward and backward GEMMs (the output head's aside: a
    call moving at least `head` bytes, the (b T, V / t) logits; torchtitan keeps it in bf16)
    runs at the target's FP8 rate (the matmul class's attained fraction, assumed as bf16's) on
    one-byte operands, writing bf16; before it both operands are cast: an amax pass (read) and a
    scaled cast (read, write one byte) per element, eager, 2 + 2 + 1 bytes per bf16 element;
    compiled, the amax fused into the producer's epilogue, 2 + 1 (torchao's Float8Linear casts
    the input and the weight for the forward, the gradient twice and the weight and the input
    again for the backward's two GEMMs; it saves the high-precision input and weight, so the
    activations a step keeps do not change). Tensorwise and rowwise scaling are priced alike.
    SpecError where the target has no FP8 tensor cores."""
    import numpy as np

    from lmperf.estimate.target import FRACTIONS

    if not target.flops_per_s.get("fp8"):
        raise SpecError(f"float8 needs FP8 tensor cores (sm_89 and newer): {target.name} has none")
    table = costs.table.copy()
    calls = table["calls"].to_numpy(dtype=float)
    per_call = ((table["bytes_read"] + table["bytes_written"]).to_numpy(dtype=float)
                / np.maximum(calls, 1))
    gemm = ((table["op_class"] == "matmul") & table["phase"].isin(("forward", "backward"))
            & (per_call < 0.99 * head)).to_numpy()
    elements = table["bytes_read"].to_numpy(dtype=float) / 2  # bf16 operands
    cast = elements * (3 if compiled else 5) * gemm
    casts = {p: float(cast[(table["phase"] == p).to_numpy()].sum())
             / (target.bandwidth * FRACTIONS["elementwise/norm"].memory)
             for p in ("forward", "backward")}
    table.loc[gemm, "dtype"] = "fp8"
    table.loc[gemm, "bytes_read"] = (table.loc[gemm, "bytes_read"] // 2).astype("int64")
    return replace(costs, table=table, method=costs.method + "; float8 GEMMs"), casts


@lru_cache(maxsize=128)
def _counted(work: Workload, precision: str, batch: int, layers: int | None = None):
    """One device's op costs at micro-batch `batch` (and `layers` blocks): counted at 1 and 2,
    read off them beyond."""
    from lmperf.estimate.op_costs import at_batch, count_op_costs

    if batch > 2:
        costs = at_batch(_counted(work, precision, 1, layers), _counted(work, precision, 2, layers),
                         batch)
        if costs is not None:
            return costs
    spec = work.spec(batch, PRECISIONS[precision])
    return count_op_costs(spec if layers is None else replace(spec, num_layers=layers))


@lru_cache(maxsize=64)
def sequence_flops(work: Workload) -> int | None:
    """Model FLOPs of one sequence's forward + backward on bench's convention
    (`measure.flops.FLOPS_CONVENTION`: causal attention over half the square, whatever kernel),
    so a plan's MFU and the MFU bench measures compare; None for a user's model (its MFU is
    counted as its ops run, as bench counts it)."""
    if work.model is not None:
        return None
    from lmperf.measure.flops import reference_step_flops
    from lmperf.workload.build import meta_flops

    spec = work.spec(1, "fp32")
    # attention left out; counted at 1 and 2 blocks and extrapolated (identical blocks: exact)
    one, two = (meta_flops(replace(spec, num_layers=n))[0] for n in (1, 2))
    counted = one + (spec.num_layers - 1) * (two - one)
    return reference_step_flops(counted, True, spec.d_model, spec.num_layers, spec.d_ff,
                                spec.vocab_size, 1, work.context, spec.mode).flops


def _micro(c: Candidate, work: Workload, shape: Shape, target, b: int) -> list[tuple]:
    """Per distinct rank: (forward s, backward s, recompute s, FLOPs, matmul s: the forward
    passes' matmuls, in forward and in recompute) of one micro-batch of `b` sequences. Without a pipeline the
    rank runs the whole model; a pipeline rank its stages' blocks, the output on the last (a
    block's time is the 2-block model's less the 1-block model's, the output's what the
    1-block model has beyond its block). Checkpointing runs the blocks' forward again, not
    the output's."""
    lay = c.layout
    cp_work = work if lay.cp == 1 else replace(work, context=work.context // lay.cp)
    keys = ("forward", "backward", "matmul forward", "matmul backward", "elementwise forward")

    def at(layers):
        times, flops = phases(cp_work, c.precision, b, target, lay.tp, lay.cp, layers,
                              c.compile, c.float8)
        return [times.get(k, 0.0) for k in keys] + [flops]

    if lay.pp == 1 and c.checkpoint == "none":
        whole = at(None)
        return [(whole[0], whole[1], 0.0, whole[5], whole[2])]
    one, two = at(1), at(2) if shape.num_layers > 1 else None
    per = [y - x for x, y in zip(one, two)] if two else one  # one block's
    head = [x - y for x, y in zip(one, per)]
    # one block's forward again: whole (full, groups, every-K's checkpointed blocks), or what
    # `op` does not save (its elementwise ops and every other matmul), and the matmuls in it
    again, again_mm = recompute_of(c.checkpoint, shape, per[0], per[2], per[4])
    if lay.pp == 1:
        whole, n = at(None), checkpointed(c.checkpoint, shape.num_layers)
        return [(whole[0], whole[1], again * n, whole[5], whole[2] + again_mm * n)]
    out = []
    for share in rank_shares(shape, c):
        fwd, bwd, mf, _, _, flops = (share.blocks * p + h * share.head
                                     for p, h in zip(per, head))
        n = checkpointed(c.checkpoint, share.blocks)
        out.append((fwd, bwd, again * n, flops, mf + again_mm * n))
    return out


def checkpointed(policy: str | int, blocks: int) -> int:
    """Blocks of `blocks` a checkpointing policy recomputes in backward: every one, but every-K's
    one in K (the K-th, 2K-th, ...) and none's."""
    from lmperf.estimate.fit import period

    if policy == "none":
        return 0
    return blocks // period(policy) if str(policy).startswith("every-") else blocks


def recompute_of(policy: str | int, shape: Shape, forward: float, matmul: float,
                 elementwise: float) -> tuple[float, float]:
    """(seconds one checkpointed block's recompute takes, of which its matmuls) for a block
    whose forward takes `forward` s, `matmul` s of it in matmuls, `elementwise` s in the rest
    but attention: the whole forward again, or under `op` (torchtitan's per-op policy:
    attention's and every other matmul's outputs saved, the rest recomputed) its elementwise
    ops and the 2nd, 4th, ... matmuls, in the reference LM k, the output projection and w3
    (model/checkpointing.op_policy): (C Hkv D + C^2 + C F) / (2 C^2 + 2 C Hkv D + 3 C F) of its
    matmul FLOPs."""
    if policy == "none":
        return 0.0, 0.0
    if policy != "op":
        return forward, matmul
    C, F = shape.d_model, shape.d_ff
    kv = C * shape.num_kv_heads // shape.num_heads if shape.num_kv_heads else C  # Hkv D
    share = (C * kv + C * C + C * F) / (2 * C * C + 2 * C * kv + 3 * C * F)
    return elementwise + matmul * share, matmul * share


def step_time(c: Candidate, work: Workload, shape: Shape, cluster: Cluster,
              global_batch: int) -> dict:
    """Predicted step of candidate `c` on its slowest rank: its parts in seconds (compute,
    recompute, optimizer, all communication and the part the step waits for, the pipeline's
    bubble and its point-to-point sends), its FLOPs, and the elements a rank sends per step
    (`sent_elements`, see `communication`)."""
    lay = c.layout
    sizes = lay.micro_batches(global_batch, c.micro_batch)
    compute = recompute = flops = bubble = p2p = 0.0
    spans = []  # (forward s, backward s with its recompute, matmul s) per micro-batch of the
    for b, count in Counter(sizes).items():  # slowest rank
        ranks = _micro(c, work, shape, cluster.target, b)
        fwd, bwd, again, f, mm = max(ranks, key=lambda x: x[0] + x[1] + x[2])
        compute += count * (fwd + bwd)
        recompute += count * again
        flops += count * f
        spans += [(fwd, bwd + again, mm)] * count
    if lay.pp > 1:
        fwd, bwd = spans[0][0], spans[0][1]
        bubble = lay.bubble(len(sizes), fwd, bwd)
        p2p = _pipeline_sends(c, shape, cluster, work.context, len(sizes))
    # counted on the rank's weights; FSDP2 under bf16-fsdp's policy steps fp32 shards: fp32's
    times, _ = phases(work, "fp32" if c.precision == "bf16-fsdp" else c.precision, 1,
                      cluster.target, lay.tp)
    optimizer = times.get("optimizer", 0.0) * max(x.params for x in rank_shares(shape, c)) \
        / shape.params / (c.shard_degree if strategy(c.strategy).shards else 1)
    total, exposed, sent = communication(c, shape, cluster, work.context, sizes, spans)
    return {"compute_s": compute, "recompute_s": recompute, "optimizer_s": optimizer,
            "comm_s": total + p2p, "exposed_comm_s": exposed + p2p, "bubble_s": bubble,
            "step_s": compute + recompute + optimizer + exposed + bubble + p2p, "flops": flops,
            "sent_elements": sent}


def readable(c: Candidate, cluster: Cluster) -> bool:
    """Whether `c` runs on lmperf's readable strategies (`--confirm` on this CPU's ranks: its
    FSDP gathers one weight at a time in the compute dtype): a blocking cluster and a pure
    data-parallel layout (`dist train` runs TP, PP and HSDP on torch's FSDP2)."""
    lay = c.layout
    return cluster.blocking and lay.tp == lay.pp == lay.cp == lay.dp_replicate == 1


def layout_prediction(work: Workload, c: Candidate, cluster: Cluster,
                      global_batch: int) -> list[dict]:
    """What candidate `c` predicts of each pipeline rank (one dict without a pipeline), in rank
    order, to hold against `dist train`'s measurement of the same layout: `peak_bytes` (its
    live bytes' peak, no allowance) and `collective_bytes` {(mesh dimension, op): bytes per
    step, S as nccl-tests defines it}, the pipeline's sends as ('pp', 'send')."""
    shape = shape_of(work)
    lines = timelines(work, c.precision, c.checkpoint)
    lay = c.layout
    sizes = lay.micro_batches(global_batch, c.micro_batch)
    a = 4 if c.precision == "fp32" else 2
    boundary = c.micro_batch * work.context / lay.cp * shape.d_model / lay.tp * a
    stages = lay.stages
    out = []
    for r, share in enumerate(rank_shares(shape, c, global_batch, every=True)):
        moved: dict = {}
        communication(c, shape, cluster, work.context, sizes, [(0.0, 0.0, 0.0)] * len(sizes),
                      share=share, moved=moved)
        if lay.pp > 1:  # a forward send out of every stage but the last, a backward one back
            sends = sum((s < stages - 1) + (s > 0) for s in lay.rank_stages(r))
            moved["pp", "send"] = sends * len(sizes) * boundary
            # TP's activation collectives: 4 a block, and one pair for the embedding's output
            # and one for the head's input on the ranks that run them (the table's 4 L + 2
            # gives every rank both)
            ends = share.embedding + share.head
            for op in ("all_gather", "reduce_scatter"):
                if ("tp", op) in moved:
                    moved["tp", op] *= (4 * share.blocks + ends) / (4 * share.blocks + 2)
        from lmperf.estimate.fit import _rank_peak

        peak = _rank_peak(lines, shape, c, share, work.context, readable(c, cluster))
        out.append({"peak_bytes": peak, "collective_bytes": moved})
    return out


def _group_link(cluster: Cluster, op: str, group: str, c: Candidate):
    """The Link a collective of `group` crosses: mesh order [pp, replicate, shard, cp, tp] from
    the outside in (torchtitan's), so a group's ranks are `stride` apart and per_node / stride
    of them share a node."""
    lay = c.layout
    link = cluster.link if not isinstance(cluster.link, dict) else (
        cluster.link["*"] if group in ("tp", "cp") else cluster.link.get(op, cluster.link["*"]))
    stride = {"tp": 1, "cp": lay.tp, "shard": lay.tp * lay.cp,
              "replicate": lay.tp * lay.cp * lay.dp_shard,
              "pp": lay.tp * lay.cp * lay.dp}[group]
    if group == "shard" and c.strategy in ("zero1", "zero2"):
        stride = lay.tp * lay.cp
    return replace(link, per_node=max(1, link.per_node // stride)) if stride > 1 else link


def _pipeline_sends(c: Candidate, shape: Shape, cluster: Cluster, context: int, m: int) -> float:
    """Seconds of point-to-point sends on a pipeline's critical path: each of its (m v + p - 1)
    forward and as many backward slots waits for one (b, T / cp, C / t)-sized activation or
    gradient (sequence parallelism keeps the boundary sharded), latency + bytes / bandwidth
    between consecutive stages (each a neighbour across the pipeline's stride)."""
    from lmperf.estimate import comm

    lay = c.layout
    a = 4 if c.precision == "fp32" else 2
    nbytes = c.micro_batch * context / lay.cp * shape.d_model / lay.tp * a
    link = _group_link(cluster, "broadcast", "pp", c)
    one = comm.collective_seconds("broadcast", nbytes, 2, link)
    return 2 * (m * lay.pp_virtual + lay.pp - 1) * one


def communication(c: Candidate, shape: Shape, cluster: Cluster, context: int,
                  sizes: list[int], spans: list[tuple[float, float]], *,
                  share=None, moved: dict | None = None) -> tuple[float, float, float]:
    """(seconds of collectives, the part a step waits for, elements a rank sends: each
    collective's S x its bus factor, the course's accounting) of candidate `c`, from the
    strategy table: each collective's time is `comm.collective_seconds` over its group's link;
    what hides behind a micro-batch's forward or backward is `comm.exposed_seconds` of that
    window (its last message exposed); the rest is waited for. Async TP (torch's micro-
    pipelining) hides a micro-batch's forward TP collectives (in forward and in recompute)
    behind the matmuls they feed or drain (`spans`' third figure), all but one chunk of each
    (1 / t) and all that outlasts them; backward's stay exposed (PyTorch's measurements: up to
    ~20% faster forward passes, ~8% faster steps of Llama 3 70B, docs/commands/plan.md).
    The rank is `share` (a `fit.RankShare`; None: the fullest); `moved`, when given, is filled
    with (group, op) -> bytes per step, each collective's S as nccl-tests defines it (what an
    all-gather returns, what a reduce-scatter or all-reduce takes)."""
    from lmperf.estimate import comm
    from lmperf.estimate.fit import block_params

    lay = c.layout
    t = lay.tp
    shares = rank_shares(shape, c)
    held = share.states if share else max(s.states for s in shares)  # its part of the params
    blocks = share.blocks if share else max(s.blocks for s in shares)
    c_bytes = 4 if c.precision == "fp32" else 2
    params = shape.params * held
    # gathered in bf16 by FSDP's policy and by the readable FSDP; in fp32 under autocast
    weights = (2 if c.precision == "bf16-fsdp" or (readable(c, cluster) and c.precision != "fp32")
               else 4) * params
    norms = 0 if shape.ffn_only else 2 * shape.d_model  # a block's RMSNorm weights, replicated
    block = (block_params(shape) - norms) / t + norms  # a block's parameters on a TP rank
    units = 7 * blocks + 2 if readable(c, cluster) else blocks + 1
    table = collectives(c.strategy, t, lay.cp, lay.pp, lay.dp_replicate)
    fsdp_blocking = readable(c, cluster) and strategy(c.strategy).gathers
    overlap = 0.0 if cluster.blocking else 1.0
    groups = {"shard": c.shard_degree if c.strategy != "ddp" else lay.dp,
              "replicate": lay.dp_replicate if c.strategy != "ddp" else lay.dp,
              "tp": t, "cp": lay.cp}
    kv = (shape.d_model * shape.num_kv_heads // shape.num_heads if shape.num_kv_heads
          else shape.d_model)  # Hkv D
    total = exposed = sent = 0.0
    windows: dict[tuple[int, str], list[float]] = {}  # (micro-batch, hides) -> [comm, last]
    async_tp = [0.0] * len(sizes)  # a micro-batch's TP collectives, behind its matmuls
    for x in table:
        group = groups[x.group]
        if group <= 1 or (x.per == "recompute" and c.checkpoint == "none"):
            continue
        link = _group_link(cluster, x.op, x.group, c)
        messages = {"one": 1, "tensors": shape.param_tensors, "units": units, "loss": 3,
                    # TP: attention and the MLP per block, and the output; the accounting
                    # model's one column / row pair per block; FSDP: one per block
                    "blocks": (blocks if shape.ffn_only or x.group != "tp"
                               else 2 * blocks + 1), "attention": blocks}[x.split]
        for i in (range(len(sizes)) if x.every == "micro" else [len(sizes) - 1]):
            tokens = sizes[i] * context / lay.cp
            size = {"grads": (weights if fsdp_blocking else 4 * params)
                    / (c.shard_degree if x.group == "replicate" and c.strategy == "fsdp" else 1),
                    "weights": weights, "params": 4 * params,
                    "block weights": weights * min(1.0, blocks * block / params),
                    # each of TP's collectives gathers (or scatters) the (b T / cp, C)
                    # activations; tensorwise float8 gathers the forward's in float8
                    # (torchtitan's Float8ColwiseParallel: cast before the all-gather)
                    "activations": messages * tokens * shape.d_model * (
                        1 if c.float8 == "tensorwise" and x.op == "all_gather"
                        and x.per != "backward" else c_bytes),
                    # each layer's K and V over the whole sequence, split by TP's heads
                    "kv": messages * sizes[i] * context * 2 * kv / t * c_bytes,
                    "norm grads": 4 * (shape.replicated_params if blocks == shape.num_layers
                                       else blocks * norms),
                    "loss": messages * tokens * 4,
                    }[x.payload]
            if moved is not None:
                key = ({"shard": "dp_shard", "replicate": "dp_replicate"}.get(x.group, x.group),
                       x.op)
                moved[key] = moved.get(key, 0.0) + size
            seconds = messages * comm.collective_seconds(x.op, size / messages, group, link)
            total += seconds
            elements = size / c_bytes if x.payload in ("activations", "kv") else params
            sent += bus_factor(x.op, group) * elements
            if x.group == "tp" and lay.async_tp and x.per != "backward":
                async_tp[i] += seconds
                continue
            if x.hides == "never" or not overlap:
                exposed += seconds
                continue
            last = (messages * comm.collective_seconds(x.op, min(BUCKET_BYTES, size), group, link)
                    if x.split == "one" else seconds / messages)
            window = windows.setdefault((i if x.every == "micro" else
                                         (0 if x.hides == "forward" else len(sizes) - 1),
                                         x.hides), [0.0, 0.0])
            window[0], window[1] = window[0] + seconds, last
    for (i, hides), (seconds, last) in windows.items():
        behind = spans[i][0] if hides == "forward" else spans[i][1]
        exposed += comm.exposed_seconds(seconds, behind, overlap, last)
    exposed += sum(max(tp / t, tp - span[2]) for tp, span in zip(async_tp, spans))
    return total, exposed, sent


# --- the search -------------------------------------------------------------------------------
def layouts(cluster: Cluster, shape: Shape, context: int, global_batch: int, space: Space,
            left: Counter) -> list[tuple[Layout, str]]:
    """(layout, strategy) pairs worth pricing, every one left out counted in `left` by its
    reason. Degrees are powers of two (or the values given); tensor parallelism stays within a
    node; context parallelism is searched from LONG_CONTEXT tokens; a layout with tensor,
    pipeline or context parallelism shards its data-parallel part with FSDP (torchtitan's
    composition: DDP, ZeRO only with pure data parallelism); HSDP replicates across nodes."""
    n = cluster.gpus

    def powers(limit: int) -> list[int]:
        return [2**i for i in range(int(math.log2(limit)) + 1) if limit % 2**i == 0]

    tps = space.tp or [t for t in powers(n) if t <= cluster.per_node]
    for t in (powers(n) if space.tp is None else []):
        if t > cluster.per_node:
            left[f"crosses nodes ({cluster.per_node} GPUs each): TP's collectives are in every "
                 "block's critical path", f"tp {t}"] += 1
    pps = space.pp or [p for p in powers(n) if p <= shape.num_layers + 2]
    cps = space.cp or ([c for c in powers(n)] if context >= LONG_CONTEXT else [1])
    if space.cp is None and context < LONG_CONTEXT:
        for c in powers(n)[1:]:
            left[f"context {context} < {LONG_CONTEXT}: attention's share is small (--cp to "
                 "price it)", f"cp {c}"] += 1
    schedules = space.pp_schedule or PP_SCHEDULES
    out = []
    for t in tps:
        for p in pps:
            for c in cps:
                if n % (t * p * c):
                    continue  # powers of two that multiply past the GPUs: no layout at all
                d = n // (t * p * c)
                for s in (schedules if p > 1 else [None]):
                    for v in (space.pp_virtual or ([2] if s in LOOPED else [1])) if p > 1 else [1]:
                        for a in (space.async_tp or (False, True)) if t > 1 else (False,):
                            for lay, strat in _data_parallel(n, t, p, c, d, s, v, a, cluster,
                                                             space, left):
                                try:
                                    lay.check(num_layers=shape.num_layers,
                                              num_heads=shape.num_heads,
                                              num_kv_heads=shape.num_kv_heads or None,
                                              context=context, global_batch=global_batch)
                                except LayoutError as exc:
                                    left[exc.why, exc.what] += 1
                                    continue
                                out.append((lay, strat))
    return out


def _data_parallel(n, t, p, c, d, s, v, a, cluster, space, left):
    """The (layout, strategy) pairs of one (t, p, c) over `d` data-parallel ranks."""
    wanted = space.strategies or ("single",) + DATA_PARALLEL
    if d == 1:
        pairs = [(1, "single")] + ([(1, "fsdp")] if c > 1 else [])
    elif t == p == c == 1:
        pairs = [(d, "ddp"), (1, "zero1"), (1, "zero2"), (1, "fsdp")]
    else:
        pairs = [(1, "fsdp")]
        for name in ("ddp", "zero1", "zero2"):
            left["with tensor, pipeline or context parallelism (torchtitan shards the data-"
                 "parallel part with FSDP)", name] += 1
    if d > 1:  # HSDP: shard within a node, replicate across
        within = max(1, cluster.per_node // (t * c))
        reps = space.dp_replicate or ([d // within] if 1 < d // within < d and d % within == 0
                                      else [])
        pairs += [(r, "fsdp") for r in reps if r > 1 and d % r == 0]
    out = []
    for r, name in pairs:
        if name not in wanted and not (name == "single" and d == 1):
            continue
        if space.dp_replicate and name != "ddp" and r not in space.dp_replicate:
            continue
        out.append((Layout(n, t, p, c, r, s, v, a), name))
    return out


def left_out_lines(left: Counter | dict) -> list[str]:
    """One line per reason the search left candidates out, 'left out: <what>: <why>
    (<count>)', the degrees it left out for that reason listed once each; `left`: (why, what)
    -> count (a record's `left_out` holds "why|what" keys)."""
    grouped: dict[str, dict[str, int]] = {}
    for key, count in left.items():
        why, what = key if isinstance(key, tuple) else key.split("|", 1)
        grouped.setdefault(why, {})
        grouped[why][what] = grouped[why].get(what, 0) + count
    return [f"left out: {', '.join(whats)}: {why} ({sum(whats.values())})"
            for why, whats in grouped.items()]


def candidates(work: Workload, shape: Shape, cluster: Cluster, global_batch: int, space: Space,
               progress: Progress | None = None,
               by_precision: dict[str, Cluster] | None = None) -> tuple[list[dict], Counter]:
    """(every candidate evaluated, ranked, see `rank`; what was left out: reason -> count).
    For each precision, checkpoint group and (layout, strategy), the largest micro-batch that
    fits and every smaller power of two (each with the accumulation, or the pipeline's
    micro-batches, that reach the global batch), plus the smallest micro-batch when none fits
    (the row that says why), timed on `by_precision`'s Cluster of its precision (a host probed
    on its ops) or `cluster`. `progress(done, total, what)` is called as the search goes."""
    left: Counter = Counter()
    precisions = [p for p in space.precisions if cluster.gpus > 1 or p != "bf16-fsdp"]
    pairs = layouts(cluster, shape, work.context, global_batch, space, left)
    from lmperf.validate import checkpoint_policy

    todo = [(p, g) for p in precisions
            for g in dict.fromkeys(checkpoint_policy(g) for g in space.checkpoints)]
    total, done, rows = len(todo) * len(pairs), 0, []
    for precision, group in todo:
        if progress:
            progress(done, total, f"simulating {precision}, checkpoint {group}")
        try:
            lines = timelines(work, precision, group)
        except SpecError:  # a user's model checkpoints every layer (transformers) or not at all
            if group == "none":
                raise
            left["this model checkpoints every layer or none", f"checkpoint {group}"] += 1
            done += len(pairs)
            continue
        target = (by_precision or {}).get(precision, cluster)
        for lay, name in pairs:
            done += 1
            if precision == "bf16-fsdp" and name != "fsdp":
                continue  # the policy belongs to FSDP
            rows += _micro_batches(work, shape, target, global_batch, lines, precision, group,
                                   name, lay, space, left)
            if progress:
                progress(done, total, f"{precision}, checkpoint {group}, {name} {lay.label()}")
    return rank(rows), left


def _micro_batches(work, shape, cluster, global_batch, lines, precision, group, name, lay,
                   space, left) -> list[dict]:
    """The rows of one (precision, checkpoint, layout, strategy): see `candidates`."""
    local = lay.local_batch(global_batch)
    allowed = [b for b in range(1, local + 1) if lay.pp == 1 or local % b == 0]
    if space.micro_batch:
        allowed = [b for b in space.micro_batch if b in allowed]
        if not allowed:
            left[f"no value splits the rank's batch {local}",
                 f"--micro-batch {', '.join(map(str, space.micro_batch))}"] += 1
            return []

    def candidate(b: int) -> Candidate:
        return Candidate(precision, group, name, lay, b, lay.grad_accum(global_batch, b))

    @lru_cache(maxsize=None)
    def peak(b: int) -> tuple[float, float]:
        c = candidate(b)
        return rank_peak(lines, shape, c, work.context, cluster.device, readable(c, cluster),
                         global_batch)

    # a rank's peak grows with its micro-batch: the largest that fits, by bisection
    lo, hi = 0, len(allowed)  # allowed[:lo] fit, allowed[hi:] do not
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(sum(peak(allowed[mid])), cluster.budget):
            lo = mid + 1
        else:
            hi = mid
    largest = allowed[lo - 1] if lo else None
    if space.micro_batch:
        tried = allowed
    else:
        tried = sorted({largest or allowed[0],
                        *(b for b in allowed if b < (largest or 1) and b & (b - 1) == 0)})
    # compile and float8 change the time, not the memory the plan models: one peak serves them;
    # compile off is never faster than on here (the same ops, fused): priced when asked for
    if space.compile is None:
        left["the same memory and never faster than compile on here (--compile off on prices "
             "both)", "compile off"] += len(tried)
    return [evaluate(replace(candidate(b), compile=comp, float8=f8), work, shape, cluster,
                     global_batch, peak(b), largest)
            for b in tried for comp in space.compile or (True,)
            for f8 in _float8_recipes(space, precision, cluster, left)]


def _float8_recipes(space: Space, precision: str, cluster: Cluster, left: Counter) -> tuple:
    """The float8 recipes searched for `precision` on `cluster`: those given, else none and
    rowwise (torchtitan 0.3's; tensorwise is priced alike); none where the target has no FP8
    tensor cores or the precision is fp32 (said once in `left`)."""
    given = space.float8 or ("none", "rowwise")
    if cluster.target.flops_per_s.get("fp8") and precision != "fp32":
        return given
    if any(f != "none" for f in given):
        why = (f"{cluster.target.name} has no FP8 tensor cores (sm_89 and newer)"
               if precision != "fp32" else "an fp32 step trains no Linear layer in float8")
        left[why, "float8"] = 1
    return ("none",)


def fewest_gpus(work: Workload, shape: Shape, cluster_of: Callable[[int], Cluster],
                precision: str, start: int, global_batch: int,
                limit: int = 2**16) -> int | None:
    """The fewest GPUs (a power of two, from `start`, dividing `global_batch`) on which one rank
    of the most frugal layouts fits: FSDP over all of them, or FSDP x TP (t 2, 4, 8 within a
    node), every block checkpointed, micro-batch 1 (accumulating the rank's share of the
    global batch), priced as the search prices it; None up to `limit`. What "nothing fits"
    points to."""
    lines = timelines(work, precision, "full")
    n = max(2, start)
    while n <= limit:
        cluster = cluster_of(n)
        for t in (1, 2, 4, 8):
            if n % t or t > cluster.per_node or n // t < 2 or shape.num_heads % t or \
                    (shape.num_kv_heads or shape.num_heads) % t or global_batch % (n // t):
                continue
            lay = Layout(n, tp=t)
            c = Candidate(precision, "full", "fsdp", lay, 1, lay.grad_accum(global_batch, 1))
            if fits(sum(rank_peak(lines, shape, c, work.context, cluster.device,
                                  readable(c, cluster), global_batch)), cluster.budget):
                return n
        n *= 2
    return None


def candidate_of(row: dict, gpus: int) -> Candidate:
    """The Candidate of a plan record's fields (its spec, or a row of the search)."""
    lay = Layout(gpus, row["tp"], row["pp"], row["cp"], row["dp_replicate"], row["pp_schedule"],
                 row["pp_virtual"], bool(row["async_tp"]))
    return Candidate(row["precision"], row["checkpoint"], row["strategy"], lay,
                     row["micro_batch"], row["grad_accum"], bool(row.get("compile")),
                     row.get("float8") or "none")


def evaluate(c: Candidate, work: Workload, shape: Shape, cluster: Cluster, global_batch: int,
             peak: tuple[float, float], largest: int | None) -> dict:
    """One candidate's row: the plan record's metrics (`mfu` None where the device has no
    published peak for the precision's math dtype: a CPU's ceilings are measured, not a peak)."""
    live, allowance = peak
    total = live + allowance
    ok = fits(total, cluster.budget)
    row = {**c.fields(), "peak_gib": total / GIB, "live_gib": live / GIB,
           "allowance_gib": allowance / GIB, "budget_gib": cluster.budget / GIB,
           "headroom_gib": (cluster.budget - total) / GIB, "fits": ok,
           "largest_micro_batch": largest}
    times = step_time(c, work, shape, cluster, global_batch)
    times.pop("sent_elements")
    step = times.pop("step_s")
    rate = None if cluster.target.synchronous else cluster.target.flops_per_s.get(
        "fp32" if c.precision == "fp32" else "bf16")
    per_seq = sequence_flops(work) if rate else None  # MFU: the step's model FLOPs / all peaks
    flops = times["flops"] if per_seq is None else per_seq * global_batch / cluster.gpus
    row.update(times, flops=flops, step_s=step,
               tokens_per_s_per_gpu=global_batch * work.context / step / cluster.gpus,
               mfu=flops / step / rate if rate else None)
    if not ok:
        row["why"] = (f"does not fit: {total / GIB:.2f} GiB per rank > {cluster.budget / GIB:.2f}"
                      + ("" if largest is None else f" (micro-batch {largest} fits)"))
    return row


def rank(rows: list[dict]) -> list[dict]:
    """Fitting candidates first, fastest first; each loser says why it lost to the winner."""
    rows.sort(key=lambda r: (not r["fits"], r["step_s"]))
    best = rows[0] if rows and rows[0]["fits"] else None
    for i, r in enumerate(rows, 1):
        r["rank"] = i
        if best is None or r is best or not r["fits"]:
            continue
        parts = {"compute": r["compute_s"] - best["compute_s"],
                 "recompute": r["recompute_s"] - best["recompute_s"],
                 "optimizer": r["optimizer_s"] - best["optimizer_s"],
                 "exposed communication": r["exposed_comm_s"] - best["exposed_comm_s"],
                 "pipeline bubble": r["bubble_s"] - best["bubble_s"]}
        worst = max(parts, key=parts.get)
        r["why"] = (f"{r['step_s'] / best['step_s']:.2f}x the winner's step: "
                    f"+{parts[worst] * 1e3:.3g} ms of {worst}")
    return rows
