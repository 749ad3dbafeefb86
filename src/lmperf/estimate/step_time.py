"""One candidate's step on its target, predicted: the op counts of one rank's micro-batch
(counted once per model and batch, cached), split by tensor and context parallelism, fused by
torch.compile, cast by float8 (`phases`); the slowest rank's micro-batches, recompute and
optimizer, the pipeline's bubble and sends, and the collectives the step waits for
(`step_time`). How each number is made: docs/commands/plan.md."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from functools import lru_cache

from lmperf.errors import SpecError
from lmperf.estimate.candidate import Candidate
from lmperf.estimate.communication import communication, pipeline_sends
from lmperf.estimate.fit import PRECISIONS, Workload, rank_shares
from lmperf.estimate.formulas import Shape
from lmperf.estimate.strategies import strategy
from lmperf.estimate.target import Cluster


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
    extra = _unpriced(costs.table, target, t)  # before compile fuses the loss's rows away
    if compile:
        costs = fused(costs)
    casts: dict[str, float] = {}
    if float8 != "none":
        head = batch * work.context * work.spec(1, "fp32").vocab_size * 2 / t
        costs, casts = _float8(costs, target, head, compile)
    table = costs.table
    times = {p: x.typical_s + casts.get(p, 0.0) + extra.get(p, 0.0)
             for p, x in phase_times(costs, target).items()}
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
             / target.streaming_bytes_per_s
             for p in ("forward", "backward")}
    table.loc[gemm, "dtype"] = "fp8"
    table.loc[gemm, "bytes_read"] = (table.loc[gemm, "bytes_read"] // 2).astype("int64")
    return replace(costs, table=table, method=costs.method + "; float8 GEMMs"), casts


# torch's loss parallelism (torch/distributed/tensor/parallel/loss.py) over a TP rank's (b, T,
# V / t) logits of L bytes, beside the fused kernels the op counts hold, per phase: (passes over
# L, fresh outputs of L, ops) it adds. Forward: amax, x - max, exp, sum, shifted - logsumexp (8
# passes, 3 outputs) where aten's _log_softmax makes 2 (1); backward: zeros_like, exp, add, mul,
# the masks (8 passes, 4 outputs) where nll_loss_backward and _log_softmax_backward_data make 5 (2).
LOSS_PARALLEL = {"forward": (6, 2, 4), "backward": (3, 2, 5)}


def _unpriced(table, target, t: int) -> dict[str, float]:
    """Seconds per phase the op counts leave out: under TP, loss parallelism's extra passes at
    the elementwise class's bandwidth, its ops, and on a CPU its extra outputs' page faults
    (LOSS_PARALLEL; `time_model.op_times` prices the counted ops' own)."""
    from lmperf.estimate.time_model import MMAP_MAX_BYTES

    per_call = table["bytes_written"] / table["calls"].clip(lower=1)
    logits = per_call[table["op"] == "aten::_log_softmax"]
    if t == 1 or not len(logits):
        return {}
    size, fresh = float(logits.max()), target.fresh_bytes_per_s
    rate = target.streaming_bytes_per_s
    out = {}
    for p, (passes, outputs, ops) in LOSS_PARALLEL.items():
        faults = outputs * size / fresh if fresh and size >= MMAP_MAX_BYTES else 0.0
        out[p] = passes * size / rate + faults + ops * target.host_op_s
    return out


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
    the output's. In `fit.rank_shares`' order (each distinct rank once)."""
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
    first = []  # the distinct pipeline ranks' micro-batch of the first size
    for b, count in Counter(sizes).items():  # slowest rank
        ranks = _micro(c, work, shape, cluster.target, b)
        fwd, bwd, again, f, mm = max(ranks, key=lambda x: x[0] + x[1] + x[2])
        compute += count * (fwd + bwd)
        recompute += count * again
        flops += count * f
        spans += [(fwd, bwd + again, mm)] * count
        first = first or ranks
    if lay.pp > 1:
        # the slowest rank idles while the other stages run the warm-up's forwards and the
        # cool-down's backwards: the bubble of a rank at their mean (stages differ: the
        # embedding's, the output's); each distinct rank counted as many times as it occurs
        alike = [s.ranks for s in rank_shares(shape, c)]
        f_all, b_all, r_all = (sum(n * x[k] for n, x in zip(alike, first)) for k in (0, 1, 2))
        slow = max(first, key=lambda x: x[0] + x[1] + x[2])
        bubble = lay.bubble(len(sizes), (f_all - slow[0]) / (lay.pp - 1),
                            (b_all + r_all - slow[1] - slow[2]) / (lay.pp - 1))
        if cluster.share < 1:
            # CPU ranks beyond the cores (each priced at `share` of one): a rank idling in its
            # bubble gives its core to a neighbour, so the step is the longer of every rank's
            # work over the cores (the mean rank's m micro-batches at the shared rate, no
            # bubble) and the critical path at a whole core
            m, path = len(sizes), compute + recompute + bubble
            if m * (f_all + b_all + r_all) / lay.pp >= path * cluster.share:
                compute, recompute, bubble = m * (f_all + b_all) / lay.pp, m * r_all / lay.pp, 0.0
            else:
                compute, recompute, bubble = (x * cluster.share
                                              for x in (compute, recompute, bubble))
        p2p = pipeline_sends(c, shape, cluster, work.context, len(sizes))
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
