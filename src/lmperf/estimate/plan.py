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
from lmperf.estimate.fit import Workload, fits, rank_peak, timelines
from lmperf.estimate.formulas import Shape
from lmperf.estimate.layout import LOOPED, Layout, LayoutError
from lmperf.estimate.step_time import sequence_flops, step_time
from lmperf.estimate.strategies import DATA_PARALLEL
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
        return rank_peak(lines, shape, candidate(b), work.context, cluster.device, global_batch)

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
            if fits(sum(rank_peak(lines, shape, c, work.context, cluster.device, global_batch)),
                    cluster.budget):
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
