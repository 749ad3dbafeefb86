"""`lmperf dist comm` on one rank: time a collective at one message size, as nccl-tests does.

Per iteration every rank meets at a barrier, starts the collective, waits for it and reads the
host clock; the iteration's time is the SLOWEST rank's (a collective is only done when the last
rank is), and the spread (slowest - fastest) shows stragglers. Honest for each backend: on gloo
`wait()` returns when the collective is done; on NCCL it only makes the current stream wait, so
the device is synchronised before the clock is read.

S, the message size, is the whole array as nccl-tests defines it (lmperf.estimate.formulas): the
all-reduced, broadcast or all-to-all'ed buffer, all_gather's output (each rank gives S/n) and
reduce_scatter's input (each rank gets S/n). S is rounded down to a multiple of n elements.
"""

from __future__ import annotations

import statistics
import timeit

import torch
import torch.distributed as dist

from lmperf.estimate.formulas import bandwidths, bus_factor
from lmperf.questions.parallel.ops import DTYPES, all_gather_flat, reduce_scatter_flat
from lmperf.questions.parallel.spec import CommJob
from lmperf.core.rank import RankContext
from lmperf.measure.stats import spread_warning, summarize
from lmperf.runtime import device as dev

# Where a backend's figure does not measure what the formula assumes.
NOT_COMPARABLE: dict[tuple[str, str], str] = {
    ("gloo", "reduce_scatter"): "gloo builds reduce_scatter from an all-reduce of the whole "
                                "array, which moves about twice the bytes busbw assumes",
}


def _issue(collective: str, count: int, n: int, dtype: torch.dtype, device: torch.device):
    """A function that starts one `collective` of `count` elements (the whole array S) and
    returns its Work; the buffers are made once, outside the timed region."""
    full = torch.ones(count, dtype=dtype, device=device)
    part = torch.ones(count // n, dtype=dtype, device=device)
    if collective == "all_reduce":
        return lambda: dist.all_reduce(full, async_op=True)
    if collective == "all_gather":  # (count / n,) per rank -> (count,)
        return lambda: all_gather_flat(full, part, async_op=True)
    if collective == "reduce_scatter":  # (count,) per rank -> (count / n,)
        return lambda: reduce_scatter_flat(part, full, async_op=True)
    if collective == "broadcast":
        return lambda: dist.broadcast(full, src=0, async_op=True)
    if collective == "all_to_all":  # (count,) -> (count,): a count/n slice to each peer
        out = torch.empty_like(full)
        return lambda: dist.all_to_all_single(out, full, async_op=True)
    raise ValueError(f"unknown collective {collective!r}")


def run_item(job: CommJob, item: str, ctx: RankContext) -> dict | None:
    """Time `item` ("collective:bytes") on this rank; rank 0 returns the record's fields."""
    collective, requested = item.split(":")
    n, device = ctx.world_size, ctx.device
    dtype = DTYPES[job.dtype]
    elem = torch.tensor([], dtype=dtype).element_size()
    count = max(n, int(requested) // elem // n * n)
    size = count * elem
    ctx.stage.now = f"allocating {collective} buffers ({size} bytes)"
    issue = _issue(collective, count, n, dtype, device)
    times_ms = []
    for i in range(job.warmup + job.iters):
        ctx.stage.now = f"{collective} iteration {i + 1}/{job.warmup + job.iters}"
        dist.barrier()  # every rank starts together, so the slowest rank's time is the op's
        dev.synchronize(device)
        t0 = timeit.default_timer()
        issue().wait()
        dev.synchronize(device)  # NCCL: wait() only orders streams; gloo: a no-op
        if i >= job.warmup:
            times_ms.append((timeit.default_timer() - t0) * 1e3)
    ctx.stage.now = "gathering the ranks' times"
    gathered = [None] * n if ctx.rank == 0 else None
    dist.gather_object(times_ms, gathered, dst=0)
    if ctx.rank != 0:
        return None
    per_rank: list[list[float]] = gathered  # type: ignore[assignment]
    slowest = [max(col) for col in zip(*per_rank)]  # per iteration: the last rank to finish
    spread = [max(col) - min(col) for col in zip(*per_rank)]
    median_s = statistics.median(slowest) / 1e3
    algbw, busbw = bandwidths(size, median_s, collective, n)
    warnings = [NOT_COMPARABLE[(job.backend, collective)]] if (job.backend, collective) in NOT_COMPARABLE else []
    time_ms = summarize(slowest)
    # bench, train and attention warn the same way (torch.utils.benchmark's IQR/median rule)
    if (noisy := spread_warning({"time": time_ms})):
        warnings.append(f"{collective} {size} B n={n}: {noisy}")
    metrics = {
        "timer": "perf_counter" + (" after cuda synchronize" if device.type == "cuda" else
                                   " after wait()"),
        "bytes": size, "count": count, "element_bytes": elem,
        "time_ms": time_ms, "spread_ms": summarize(spread), "per_rank_ms": per_rank,
        "bus_factor": bus_factor(collective, n),
        "algbw_gbps": algbw, "busbw_gbps": busbw,
        "comparable": (job.backend, collective) not in NOT_COMPARABLE,
    }
    return {"metrics": metrics, "warnings": warnings}
