"""The fastest configuration that fits: a search over precision x checkpointing x sharding x
micro-batch, each candidate's per-rank peak simulated (`estimate.fit`: two simulations per
precision and checkpointing, every micro-batch and strategy read off them) and its step time
predicted: per micro-batch, forward + backward (+ one forward more when checkpointing) from the
op counts on the target (`estimate.time_model`, divided by the tensor-parallel degree t), the
optimizer on the rank's share of the parameters, and the exposed part of each strategy's
collectives (`estimate.comm`: latency + bandwidth, overlap as `comm.exposed_seconds` states).
Which collectives each strategy issues, and when: docs/commands/plan.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from lmperf.estimate.fit import PRECISIONS, Workload, rank_peak, timelines
from lmperf.estimate.formulas import Shape, tp_params

GIB = 2**30
BUCKET_BYTES = 25 * 2**20  # DDP's default bucket: the last one is exposed
DATA_PARALLEL = ("ddp", "zero1", "zero2", "fsdp")


@dataclass(frozen=True)
class Cluster:
    """Where the plan runs: `gpus` devices, `per_node` per node, `budget` bytes each, a time
    target (`time_model.Target`: MFU's peaks) and links (`comm.Link`, or per collective)."""

    name: str
    gpus: int
    per_node: int
    budget: float
    target: object
    link: object
    device: str  # 'cuda' or 'cpu'
    blocking: bool = False  # collectives block (lmperf's readable strategies, --confirm's)


@dataclass(frozen=True)
class Candidate:
    """One configuration (checkpoint: block-group size, 0 none; grad_accum: micro-batches)."""

    precision: str
    checkpoint: int
    strategy: str
    tp: int
    micro_batch: int
    grad_accum: int


def strategies(cluster: Cluster, runnable: tuple[str, ...] | None = None) -> list[tuple[str, int]]:
    """(strategy, t) pairs worth planning: the data-parallel ones, and fsdp+tp for t in 2, 4, 8
    dividing the GPUs within a node (TP's all-reduces are in the critical path)."""
    pairs = [(s, 1) for s in DATA_PARALLEL]
    pairs += [("fsdp+tp", t) for t in (2, 4, 8)
              if t < cluster.gpus and cluster.gpus % t == 0 and t <= cluster.per_node]
    return [p for p in pairs if runnable is None or p[0] in runnable]


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
                 config.num_layers, config.num_heads, config.vocab_size, numels=numels)


_TIMES: dict[tuple, tuple[dict, int]] = {}


def _phases(work: Workload, precision: str, batch: int, target: object, t: int = 1
            ) -> tuple[dict, int]:
    """(phase -> predicted seconds, forward + backward FLOPs) of one micro-batch of `batch` on
    one device of `target` holding 1 / `t` of each op (tensor parallelism: the device's time
    divided, the host's not: every rank issues every op); ops counted once per process."""
    from lmperf.estimate.op_costs import count_op_costs
    from lmperf.estimate.time_model import phase_times

    key = (work, precision, batch, id(target))
    if key not in _TIMES:
        costs = count_op_costs(work.spec(batch, PRECISIONS[precision]))
        table = costs.table
        _TIMES[key] = (phase_times(costs, target),
                       int(table.loc[table["phase"].isin(("forward", "backward")), "flops"].sum()))
    times, flops = _TIMES[key]
    floor = 0.0 if target.synchronous else 1.0  # a GPU waits for its host; a CPU adds it
    return {p: max(floor * x.host_s, x.typical_s - x.device_s * (1 - 1 / t))
            for p, x in times.items()}, flops // t


def step_time(c: Candidate, work: Workload, shape: Shape, cluster: Cluster,
              global_batch: int) -> dict:
    """Predicted step of candidate `c` on one rank: its parts in seconds and its FLOPs."""
    from lmperf.estimate import comm

    n, t = cluster.gpus, c.tp
    d = n // t
    per_replica = global_batch // d
    sizes = [c.micro_batch] * (c.grad_accum - 1) + [per_replica - c.micro_batch * (c.grad_accum - 1)]
    compute = recompute = flops = 0.0
    spans = []  # (forward s, backward s with its recompute) per micro-batch
    for b in sizes:
        phases, f = _phases(work, c.precision, b, cluster.target, t)
        fwd, bwd = phases.get("forward", 0.0), phases.get("backward", 0.0)
        # checkpointing runs the blocks' forward again, not the head's (2 b T C V of ~f t / 3)
        again = fwd * max(0.0, 1 - 6 * b * work.context * shape.d_model * shape.vocab_size
                          / (f * t)) if c.checkpoint and f else 0.0
        compute, recompute, flops = compute + fwd + bwd, recompute + again, flops + f
        spans.append((fwd, bwd + again))
    last_bwd = spans[-1][1]
    held = tp_params(shape, t) / shape.params if t > 1 else 1.0
    share = held / (d if c.strategy in ("zero1", "zero2", "fsdp", "fsdp+tp") else 1)
    phases, _ = _phases(work, c.precision, sizes[-1], cluster.target, t)
    optimizer = phases.get("optimizer", 0.0) * share
    s_fp32 = 4 * shape.params * held
    # gathered in bf16 by FSDP's policy and by the readable FSDP; in fp32 under autocast
    s_c = (2 if c.precision == "bf16-fsdp" or (cluster.blocking and c.precision != "fp32")
           else 4) * shape.params * held
    def run(coll: str, nbytes: float, messages: int = 1) -> float:
        """`messages` collectives of `nbytes` / `messages` each over the data-parallel group,
        which takes every t-th device (per_node / t of its members share a node)."""
        link = cluster.link.get(coll, cluster.link["*"]) if isinstance(cluster.link, dict) \
            else cluster.link
        link = replace(link, per_node=max(1, link.per_node // t))
        return messages * comm.collective_seconds(coll, nbytes / messages, d, link)

    overlap = 0.0 if cluster.blocking else 1.0
    bucket = min(BUCKET_BYTES, s_fp32)
    total_comm = exposed = 0.0
    if c.strategy in ("ddp", "zero1") and d > 1:
        reduce = run("all_reduce", s_fp32)
        exposed += comm.exposed_seconds(reduce, last_bwd, overlap, run("all_reduce", bucket))
        total_comm += reduce
        if c.strategy == "zero1":  # updated parameters back from their owners, a tensor each
            after = run("broadcast", s_fp32, shape.param_tensors)
            exposed, total_comm = exposed + after, total_comm + after
    elif c.strategy == "zero2" and d > 1:
        for _, bwd in spans:
            reduce = run("reduce_scatter", s_fp32)
            exposed += comm.exposed_seconds(reduce, bwd, overlap, run("reduce_scatter", bucket))
            total_comm += reduce
        after = run("all_gather", s_fp32)
        exposed, total_comm = exposed + after, total_comm + after
    elif c.strategy.startswith("fsdp"):
        # FSDP2 gathers a block at a time (and the root); the readable FSDP each Linear and
        # Embedding weight, and reduce-scatters in the compute dtype: one collective each
        units = 7 * shape.num_layers + 2 if cluster.blocking else shape.num_layers + 1
        c_bytes = 2 if c.precision != "fp32" else 4
        s_reduce = s_c if cluster.blocking else s_fp32
        for b, (fwd, bwd) in zip(sizes, spans):
            gather, reduce = run("all_gather", s_c, units), run("reduce_scatter", s_reduce, units)
            if d > 1:
                exposed += comm.exposed_seconds(gather, fwd, overlap, gather / units)
                exposed += comm.exposed_seconds(gather + reduce, bwd, overlap, reduce / units)
                total_comm += 2 * gather + reduce
            if t > 1:  # TP's activation all-reduces: in the critical path
                link = cluster.link["*"] if isinstance(cluster.link, dict) else cluster.link
                tp = shape.tp_all_reduces * comm.collective_seconds(
                    "all_reduce", b * work.context * shape.d_model * c_bytes, t, link)
                exposed, total_comm = exposed + tp, total_comm + tp
    comm_exposed = exposed
    total = compute + recompute + optimizer + comm_exposed
    return {"compute_s": compute, "recompute_s": recompute, "optimizer_s": optimizer,
            "comm_s": total_comm, "exposed_comm_s": comm_exposed, "step_s": total,
            "flops": flops}


def candidates(work: Workload, shape: Shape, cluster: Cluster, global_batch: int,
               checkpoints: tuple[int, ...], precisions: tuple[str, ...],
               runnable: tuple[str, ...] | None = None) -> list[dict]:
    """Every candidate evaluated: for each precision, checkpoint group and (strategy, t), the
    largest micro-batch that fits and every smaller power of two (each with the accumulation
    that reaches the global batch), plus the smallest micro-batch when none fits (the row
    that says why). One row per candidate (see `evaluate`)."""
    from lmperf.errors import SpecError

    rows = []
    for precision in precisions:
        for group in checkpoints:
            try:
                lines = timelines(work, precision, group)
            except SpecError:  # a user's model checkpoints every layer (transformers) or not at all
                if not group:
                    raise
                continue
            for strategy, t in strategies(cluster, runnable):
                if precision == "bf16-fsdp" and not strategy.startswith("fsdp"):
                    continue  # the policy belongs to FSDP
                d = cluster.gpus // t
                if global_batch % d:
                    continue
                per_replica = global_batch // d

                def peak(b: int) -> tuple[float, float]:
                    return rank_peak(lines, shape, strategy, cluster.gpus, t, b,
                                     math.ceil(per_replica / b), precision, cluster.device,
                                     work.context, cluster.blocking)

                fitting = [b for b in range(1, per_replica + 1) if sum(peak(b)) <= cluster.budget]
                largest = max(fitting, default=None)
                tried = sorted({largest or 1, *(2**i for i in range(12) if 2**i < (largest or 1))})
                for b in tried:
                    c = Candidate(precision, group, strategy, t, b, math.ceil(per_replica / b))
                    rows.append(evaluate(c, work, shape, cluster, global_batch, peak(b),
                                         largest))
    return rank(rows)


def evaluate(c: Candidate, work: Workload, shape: Shape, cluster: Cluster, global_batch: int,
             peak: tuple[float, float], largest: int | None) -> dict:
    """One candidate's row: the plan record's metrics."""
    live, allowance = peak
    total = live + allowance
    fits = total <= cluster.budget
    row = {**c.__dict__, "peak_gib": total / GIB, "live_gib": live / GIB,
           "allowance_gib": allowance / GIB, "budget_gib": cluster.budget / GIB,
           "headroom_gib": (cluster.budget - total) / GIB, "fits": fits,
           "largest_micro_batch": largest}
    times = step_time(c, work, shape, cluster, global_batch)
    step = times.pop("step_s")
    row.update(times, step_s=step,
               tokens_per_s_per_gpu=global_batch * work.context / step / cluster.gpus,
               mfu=times["flops"] / step / _peak(cluster, c.precision))
    if not fits:
        row["why"] = (f"does not fit: {total / GIB:.2f} GiB per rank > {cluster.budget / GIB:.2f}"
                      + ("" if largest is None else f" (micro-batch {largest} fits)"))
    return row


def _peak(cluster: Cluster, precision: str) -> float:
    """FLOP/s that MFU is taken against: the dense peak of the precision's matmul dtype."""
    rates = cluster.target.flops_per_s
    return rates.get("fp32" if precision == "fp32" else "bf16") or max(rates.values())


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
                 "exposed communication": r["exposed_comm_s"] - best["exposed_comm_s"]}
        worst = max(parts, key=parts.get)
        r["why"] = (f"{r['step_s'] / best['step_s']:.2f}x the winner's step: "
                    f"+{parts[worst] * 1e3:.3g} ms of {worst}")
    return rows
