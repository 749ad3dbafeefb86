"""The fastest configuration that fits: a search over precision x checkpointing x sharding x
micro-batch, each candidate's per-rank peak simulated (`estimate.fit`) and its step predicted
(`step_time`: the op counts of one rank on the target, the strategy table's collectives). How
each number is made: docs/commands/plan.md."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Callable

from lmperf.estimate.fit import PRECISIONS, Workload, fits, rank_peak, timelines
from lmperf.estimate.formulas import Shape, bus_factor, tp_params
from lmperf.estimate.strategies import BUCKET_BYTES, DATA_PARALLEL, collectives, strategy
from lmperf.estimate.target import GIB, Cluster

Progress = Callable[[int, int, str], None]  # (done, total, what is being done)


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
    """(strategy, t) pairs worth planning: one device is 'single' (every data-parallel strategy
    is the same step there); else the data-parallel ones, and fsdp+tp for t in 2, 4, 8 dividing
    the GPUs within a node (TP's all-reduces are in the critical path)."""
    if cluster.gpus == 1:
        return [("single", 1)]
    pairs = [(s, 1) for s in DATA_PARALLEL]
    pairs += [("fsdp+tp", t) for t in (2, 4, 8)
              if t < cluster.gpus and cluster.gpus % t == 0 and t <= cluster.per_node]
    return [p for p in pairs if runnable is None or p[0] in runnable]


def precisions_for(precisions: tuple[str, ...], gpus: int) -> tuple[str, ...]:
    """The precisions worth searching on `gpus` devices: FSDP's mixed-precision policy
    (bf16-fsdp) needs FSDP, and one device runs no FSDP (`lmperf plan` refuses it there)."""
    return tuple(p for p in precisions if gpus > 1 or p != "bf16-fsdp")


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


@lru_cache(maxsize=256)
def phases(work: Workload, precision: str, batch: int, target, t: int = 1) -> tuple[dict, int]:
    """(phase -> predicted seconds, forward + backward FLOPs) of one micro-batch of `batch` on
    one device of `target` holding its 1 / `t` of a tensor-parallel step: the ops of that rank
    counted as it runs them (`op_costs.count_op_costs(tp=t)`), whole where TP does not split
    them. Cached by value: a Target is frozen and compares by its figures."""
    from lmperf.estimate.time_model import phase_times

    costs = _counted(work, precision, batch, t)
    table = costs.table
    times = phase_times(costs, target)
    return ({p: x.typical_s for p, x in times.items()},
            int(table.loc[table["phase"].isin(("forward", "backward")), "flops"].sum()))


@lru_cache(maxsize=64)
def _counted(work: Workload, precision: str, batch: int, t: int):
    """One rank's op costs at micro-batch `batch`: counted at 1 and 2, read off them beyond."""
    from lmperf.estimate.op_costs import at_batch, count_op_costs

    if batch > 2:
        costs = at_batch(_counted(work, precision, 1, t), _counted(work, precision, 2, t), batch)
        if costs is not None:
            return costs
    try:
        return count_op_costs(work.spec(batch, PRECISIONS[precision]), tp=t)
    except Exception as exc:  # a width or a head count that t does not divide
        if t == 1:
            raise
        from lmperf.errors import SpecError

        raise SpecError(f"{t}-way tensor parallelism does not split this model: "
                        f"{type(exc).__name__}") from None


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
    counted, _ = meta_flops(spec)  # attention left out
    return reference_step_flops(counted, True, spec.d_model, spec.num_layers, spec.d_ff,
                                spec.vocab_size, 1, work.context, spec.mode).flops


def step_time(c: Candidate, work: Workload, shape: Shape, cluster: Cluster,
              global_batch: int) -> dict:
    """Predicted step of candidate `c` on one rank: its parts in seconds, its FLOPs, and the
    elements each rank sends per step (`sent_elements`, see `communication`)."""
    n, t = cluster.gpus, c.tp
    d = n // t
    per_replica = global_batch // d
    sizes = [c.micro_batch] * (c.grad_accum - 1) + [per_replica - c.micro_batch * (c.grad_accum - 1)]
    compute = recompute = flops = 0.0
    spans = []  # (forward s, backward s with its recompute) per micro-batch
    for b in sizes:
        times, f = phases(work, c.precision, b, cluster.target, t)
        fwd, bwd = times.get("forward", 0.0), times.get("backward", 0.0)
        # checkpointing runs the blocks' forward again, not the head's (2 b T C V / t of ~f / 3)
        again = fwd * max(0.0, 1 - 6 * b * work.context * shape.d_model * shape.vocab_size
                          / (f * t)) if c.checkpoint and f else 0.0
        compute, recompute, flops = compute + fwd + bwd, recompute + again, flops + f
        spans.append((fwd, bwd + again))
    # counted on P_t; under bf16-fsdp's policy FSDP2 steps fp32 shards: fp32's optimizer ops
    times, _ = (phases(work, "fp32", 1, cluster.target, t) if c.precision == "bf16-fsdp"
                else phases(work, c.precision, sizes[-1], cluster.target, t))
    optimizer = times.get("optimizer", 0.0) / (d if strategy(c.strategy).shards else 1)
    total, exposed, sent = communication(c, shape, cluster, work.context, sizes, spans)
    return {"compute_s": compute, "recompute_s": recompute, "optimizer_s": optimizer,
            "comm_s": total, "exposed_comm_s": exposed,
            "step_s": compute + recompute + optimizer + exposed, "flops": flops,
            "sent_elements": sent}


def communication(c: Candidate, shape: Shape, cluster: Cluster, context: int,
                  sizes: list[int], spans: list[tuple[float, float]]
                  ) -> tuple[float, float, float]:
    """(seconds of communication, the part a step waits for, elements a rank sends: each
    collective's S x its bus factor, the course's accounting) of candidate `c`, from the
    strategy table: each collective's
    time is `comm.collective_seconds`; what hides behind a micro-batch's forward or backward is
    `comm.exposed_seconds` of that window (its last message exposed); the rest is waited for."""
    from lmperf.estimate import comm

    n, t = cluster.gpus, c.tp
    d = n // t
    held = tp_params(shape, t) / shape.params if t > 1 else 1.0
    c_bytes = 4 if c.precision == "fp32" else 2
    # gathered in bf16 by FSDP's policy and by the readable FSDP; in fp32 under autocast
    weights = (2 if c.precision == "bf16-fsdp" or (cluster.blocking and c.precision != "fp32")
               else 4) * shape.params * held
    # the readable FSDP (blocking) reduce-scatters in the compute dtype, one collective per weight
    units = 7 * shape.num_layers + 2 if cluster.blocking else shape.num_layers + 1
    table = collectives(c.strategy, t)
    fsdp_blocking = cluster.blocking and any(x.split == "units" for x in table)
    overlap = 0.0 if cluster.blocking else 1.0
    total = exposed = sent = 0.0
    windows: dict[tuple[int, str], list[float]] = {}  # (micro-batch, hides) -> [comm, last]
    for x in table:
        tp = x.payload == "activations"
        group = t if tp else d
        if group <= 1:
            continue
        link = cluster.link if not isinstance(cluster.link, dict) else (
            cluster.link["*"] if tp else cluster.link.get(x.op, cluster.link["*"]))
        if not tp:  # the data-parallel group takes every t-th device: per_node / t share a node
            link = replace(link, per_node=max(1, link.per_node // t))
        messages = {"one": 1, "tensors": shape.param_tensors, "units": units,
                    "layers": shape.tp_all_reduces}[x.split]
        for i in (range(len(sizes)) if x.every == "micro" else [len(sizes) - 1]):
            size = {"grads": weights if fsdp_blocking else 4 * shape.params * held,
                    "weights": weights, "params": 4 * shape.params * held,
                    # each of TP's all-reduces carries the micro-batch's (b T, C) activations
                    "activations": messages * sizes[i] * context * shape.d_model * c_bytes,
                    }[x.payload]
            seconds = messages * comm.collective_seconds(x.op, size / messages, group, link)
            total += seconds
            elements = size / c_bytes if tp else shape.params * held
            sent += bus_factor(x.op, group) * elements
            if x.hides == "never" or not overlap:
                exposed += seconds
                continue
            last = (messages * comm.collective_seconds(x.op, min(BUCKET_BYTES, size), group, link)
                    if x.split == "one" else seconds / messages)
            window = windows.setdefault((i, x.hides), [0.0, 0.0])
            window[0], window[1] = window[0] + seconds, last
    for (i, hides), (seconds, last) in windows.items():
        behind = spans[i][0] if hides == "forward" else spans[i][1]
        exposed += comm.exposed_seconds(seconds, behind, overlap, last)
    return total, exposed, sent


def candidates(work: Workload, shape: Shape, cluster: Cluster, global_batch: int,
               checkpoints: tuple[int, ...], precisions: tuple[str, ...],
               runnable: tuple[str, ...] | None = None,
               progress: Progress | None = None,
               by_precision: dict[str, Cluster] | None = None) -> list[dict]:
    """Every distinct candidate evaluated, ranked (see `rank`): for each precision, checkpoint
    group and (strategy, t), the largest micro-batch that fits and every smaller power of two
    (each with the accumulation that reaches the global batch), plus the smallest micro-batch
    when none fits (the row that says why), timed on `by_precision`'s Cluster of its precision
    (a host probed on its ops) or `cluster`. `progress(done, total, what)` is called before each
    (precision, checkpoint) is simulated and after each strategy is evaluated."""
    from lmperf.errors import SpecError

    precisions = precisions_for(precisions, cluster.gpus)
    pairs = strategies(cluster, runnable)
    todo = [(p, g) for p in precisions for g in dict.fromkeys(checkpoints)]
    total, done, rows = len(todo) * len(pairs), 0, []
    for precision, group in todo:
        if progress:
            progress(done, total, f"simulating {precision}, checkpoint {group}")
        try:
            lines = timelines(work, precision, group)
        except SpecError:  # a user's model checkpoints every layer (transformers) or not at all
            if not group:
                raise
            done += len(pairs)
            continue
        for strategy, t in pairs:
            done += 1
            d = cluster.gpus // t
            if global_batch % d or (precision == "bf16-fsdp" and not strategy.startswith("fsdp")):
                continue  # the policy belongs to FSDP
            try:
                rows += _micro_batches(work, shape, (by_precision or {}).get(precision, cluster),
                                       global_batch, lines, precision, group, strategy, t)
            except SpecError:  # TP cannot split this model's heads or widths by t
                if t == 1:
                    raise
            if progress:
                progress(done, total, f"{precision}, checkpoint {group}, {strategy}"
                         + (f" x {t}" if t > 1 else ""))
    return rank(rows)


def _micro_batches(work, shape, cluster, global_batch, lines, precision, group, strategy,
                   t) -> list[dict]:
    """The rows of one (precision, checkpoint, strategy, t): see `candidates`."""
    per_replica = global_batch // (cluster.gpus // t)

    def peak(b: int) -> tuple[float, float]:
        return rank_peak(lines, shape, strategy, cluster.gpus, t, b, math.ceil(per_replica / b),
                         precision, cluster.device, work.context, cluster.blocking)

    fitting = [b for b in range(1, per_replica + 1) if fits(sum(peak(b)), cluster.budget)]
    largest = max(fitting, default=None)
    tried = sorted({largest or 1, *(2**i for i in range(12) if 2**i < (largest or 1))})
    return [evaluate(Candidate(precision, group, strategy, t, b, math.ceil(per_replica / b)),
                     work, shape, cluster, global_batch, peak(b), largest) for b in tried]


def evaluate(c: Candidate, work: Workload, shape: Shape, cluster: Cluster, global_batch: int,
             peak: tuple[float, float], largest: int | None) -> dict:
    """One candidate's row: the plan record's metrics (`mfu` None where the device has no
    published peak for the precision's math dtype: a CPU's ceilings are measured, not a peak)."""
    live, allowance = peak
    total = live + allowance
    ok = fits(total, cluster.budget)
    row = {**c.__dict__, "peak_gib": total / GIB, "live_gib": live / GIB,
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
                 "exposed communication": r["exposed_comm_s"] - best["exposed_comm_s"]}
        worst = max(parts, key=parts.get)
        r["why"] = (f"{r['step_s'] / best['step_s']:.2f}x the winner's step: "
                    f"+{parts[worst] * 1e3:.3g} ms of {worst}")
    return rows
