"""A candidate's collectives: each one's seconds over its group's link and the part a step
waits for (`communication`), the pipeline's point-to-point sends, and what each pipeline rank
moves and holds (`layout_prediction`, what `plan --confirm` holds against `dist train`). How
each number is made: docs/commands/plan.md."""

from __future__ import annotations

from dataclasses import replace

from lmperf.estimate.candidate import Candidate
from lmperf.estimate.fit import Workload, rank_shares, shape_of, timelines
from lmperf.estimate.formulas import Shape, bus_factor
from lmperf.estimate.strategies import BUCKET_BYTES, collectives
from lmperf.estimate.target import Cluster


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

        peak = _rank_peak(lines, shape, c, share, work.context)
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


def pipeline_sends(c: Candidate, shape: Shape, cluster: Cluster, context: int, m: int) -> float:
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
    ~20% faster forward passes, ~8% faster steps of Llama 3 70B, docs/commands/plan.md). Its
    fused reduce-scatters add their own exposed cost: summing the t partials on each rank, a
    streaming read of S and write of S / t at the target's elementwise share of its bandwidth.
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
    weights = (2 if c.precision == "bf16-fsdp" else 4) * params  # FSDP's policy gathers bf16
    norms = 0 if shape.ffn_only else 2 * shape.d_model  # a block's RMSNorm weights, replicated
    block = (block_params(shape) - norms) / t + norms  # a block's parameters on a TP rank
    units = blocks + 1
    table = collectives(c.strategy, t, lay.cp, lay.pp, lay.dp_replicate)
    overlap = 0.0 if cluster.blocking else 1.0
    groups = {"shard": c.shard_degree if c.strategy != "ddp" else lay.dp,
              "replicate": lay.dp_replicate if c.strategy != "ddp" else lay.dp,
              "tp": t, "cp": lay.cp}
    kv = (shape.d_model * shape.num_kv_heads // shape.num_heads if shape.num_kv_heads
          else shape.d_model)  # Hkv D
    total = exposed = sent = 0.0
    windows: dict[tuple[int, str], list[float]] = {}  # (micro-batch, hides) -> [comm, last]
    async_tp = [0.0] * len(sizes)  # a micro-batch's TP collectives, behind its matmuls
    reduced = 0.0  # seconds async TP's fused reduce-scatters spend summing their partials
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
            size = {"grads": 4 * params / (c.shard_degree if x.group == "replicate"
                                           and c.strategy == "fsdp" else 1),
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
                if x.op == "reduce_scatter":
                    # torch's fused matmul + reduce-scatter (`_fused_matmul_reduce_scatter_impl`)
                    # all-to-alls each rank's t partial chunks, then sums them on the rank
                    # (`torch.sum(stacked_partials, dim=0)`): it reads the t (b T / (cp t), C)
                    # partials (S bytes) and writes S / t, after the last chunk lands, so
                    # nothing hides it; NCCL's reduce-scatter does that sum inside the collective
                    reduced += size * (1 + 1 / t) / cluster.target.streaming_bytes_per_s
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
    exposed += sum(max(tp / t, tp - span[2]) for tp, span in zip(async_tp, spans)) + reduced
    return total + reduced, exposed, sent
