"""A plan request -> one 'plan' record per candidate of `lmperf.estimate.plan`'s search (every
figure PREDICTED, said in its method); `--confirm K` -> 2 K cells run on ranks, then scored."""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from dataclasses import replace

import torch

from lmperf.errors import SpecError
from lmperf.questions.plan.spec import (OPTIMIZER, RUNNABLE_ON_CPU, ConfirmAlone, ConfirmJob,
                                        PlanSpec)

METHOD = ("PREDICTED, not measured: per-rank peak from two simulated steps weighted by what the "
          "strategy keeps (lmperf.estimate.fit); step time from per-op counts on the target and "
          "each collective's latency + bandwidth (estimate.time_model, estimate.comm)")
CANDIDATE = ("precision", "checkpoint", "strategy", "dp_replicate", "dp_shard", "tp", "pp", "cp",
             "pp_schedule", "pp_virtual", "async_tp", "micro_batch", "grad_accum", "compile",
             "float8")


def search(spec: PlanSpec, progress=None) -> tuple[list[dict], dict, str, dict]:
    """(ranked candidate rows, env, what the target is, what was left out: reason -> count) of
    `spec`; `progress(done, total, what)` is told how far the search is."""
    from lmperf.estimate.fit import PRECISIONS, Workload
    from lmperf.estimate.fit import shape_of
    from lmperf.estimate.plan import candidates, fewest_gpus, left_out_lines
    from lmperf.estimate.target import cluster
    from lmperf.runtime.env import capture

    device = spec.device
    work = Workload(spec.size, spec.course, spec.model, spec.context, spec.attention, device,
                    OPTIMIZER[device])
    # the host per op: --host-us, else probed on each precision's ops (GPU at hand); a CPU once
    probed = [p for p in spec.precisions if spec.gpus > 1 or p != "bf16-fsdp"] if spec.gpu else ()
    targets = {p: cluster(spec.gpu, spec.gpus, gpus_per_node=spec.gpus_per_node, gib=spec.gib,
                          host_us=spec.host_us, probe=work.spec(1, PRECISIONS[p]),
                          node_bandwidth=spec.node_bandwidth)
               for p in probed or spec.precisions[:1]}
    target = next(iter(targets.values()))
    shape = shape_of(work)
    rows, left = candidates(work, shape, target, spec.global_batch, spec.space(), progress,
                            targets)
    if rows and not rows[0]["fits"] and spec.gpu:  # where it would: the fewest GPUs
        precision = "bf16-fsdp" if "bf16-fsdp" in spec.precisions or spec.gpus == 1 and \
            "bf16-mixed" in spec.precisions else spec.precisions[0]
        rows[0]["fits_on_gpus"] = fewest_gpus(
            work, shape, lambda n: cluster(spec.gpu, n, gpus_per_node=spec.gpus_per_node,
                                           gib=spec.gib, host_us=spec.host_us or 5.0),
            precision, 2 * spec.gpus, spec.global_batch)
    if not rows:
        why = "; ".join(line.removeprefix("left out: ") for line in left_out_lines(left))
        raise SpecError(f"nothing to plan for {spec.gpus} devices and global batch "
                        f"{spec.global_batch}: {why or 'no layout applies'}")
    return rows, capture(torch.device("cpu")), \
        f"{spec.gpus} x {target.name}, {target.budget / 2**30:.3g} GiB each", \
        {f"{why}|{what}": count for (why, what), count in left.items()}


def records(spec: PlanSpec, progress=None) -> list[dict]:
    """One 'plan' record per candidate evaluated, fitting or not (ranked), each with the id of
    this search (`spec.search`: a file may hold several searches)."""
    from lmperf.results.schema import make_record

    t0 = time.perf_counter()
    rows, env, target, left = search(spec, progress)
    took = time.perf_counter() - t0
    search_id = time.strftime("%Y%m%d-%H%M%S-") + os.urandom(2).hex()
    out = []
    for row in rows:
        metrics = {k: v for k, v in row.items() if k not in CANDIDATE}
        metrics.update(method=METHOD, target=target, search_s=took)
        if row["rank"] == 1:  # the search's own: what it left out, and why
            metrics["left_out"] = left
        out.append(make_record("plan", {**spec.to_dict(), "search": search_id,
                                        **{k: row[k] for k in CANDIDATE}}, "ok", env,
                               metrics=metrics))
    return out


# the pipeline schedules --confirm runs (dist train's tests cover them; the zero-bubble ones it
# builds too, but their memory is not confirmed)
CONFIRMED_SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B")


def runner_of(row: dict, spec: PlanSpec) -> str | None:
    """How --confirm runs plan `row` here: 'engine' (a data-parallel plan on torch's DDP, ZeRO-1
    or FSDP2 as `dist train` builds them, or one device), 'layout' (TP, PP, HSDP on `dist
    train`'s layout builder,
    questions/parallel/layouts.py) or None (not here: context parallelism, async TP, compile or
    float8, a checkpointed or zero-bubble pipeline, a schedule torch refuses for its
    micro-batches)."""
    from lmperf.errors import SpecError
    from lmperf.estimate.plan import candidate_of
    from lmperf.questions.parallel.items import NO_STRATEGY, Item, check_schedule

    layout = row["tp"] > 1 or row["pp"] > 1 or row["dp_replicate"] > 1 and row["strategy"] != "ddp"
    if not layout:
        return "engine" if row["strategy"] in RUNNABLE_ON_CPU else None
    if spec.gpus == 1 or row["cp"] > 1 or row["async_tp"] or row.get("compile") or \
            row.get("float8", "none") != "none":
        return None
    if row["pp"] > 1 and (row["checkpoint"] not in (0, "none")
                          or row["pp_schedule"] not in CONFIRMED_SCHEDULES):
        return None
    lay = candidate_of(row, spec.gpus).layout
    try:
        check_schedule(Item("fsdp2" if lay.dp > 1 else NO_STRATEGY, lay, row["micro_batch"]),
                       lay.local_batch(spec.global_batch))
    except SpecError:
        return None
    return "layout"


# --confirm on several ranks times its plans in 2 rounds, the second in reverse order
# (ConfirmJob.rounds): a load that drifts through the minutes of the run meets every plan alike
ROUNDS = 2
TIE = math.log(1.02)  # plans predicted within 2% of each other: a tie the model does not rank


def _picks(spec: PlanSpec, rows: list[dict], k: int) -> list[dict]:
    """k fitting plans --confirm can run here: the fastest TP plan and the fastest PP plan
    where the search has them, the rest spread over the predicted times (log-spaced from the
    fastest to the slowest, not over rank positions: two plans predicted 2% apart rank by the
    machine's noise, not the model, so a plan within 2% of one picked is taken only when
    nothing else is left, and then the one farthest from every pick), in rank order."""
    fitting = [r for r in rows if r["fits"] and runner_of(r, spec)]
    if k > len(fitting):
        raise SpecError(f"--confirm {k}: only {len(fitting)} candidate(s) fit and run here")
    picks: list[dict] = []
    def apart(r: dict) -> bool:  # more than TIE from every pick
        return all(abs(math.log(r["step_s"] / p["step_s"])) > TIE for p in picks)

    for dim in ("tp", "pp"):
        mine = [r for r in fitting if r[dim] > 1 and all(r is not p for p in picks)]
        found = next((r for r in mine if apart(r)), mine[0] if mine else None)
        if found is not None and len(picks) < k:
            picks.append(found)
    def gap(r: dict) -> float:  # log-distance to the nearest pick
        return min((abs(math.log(r["step_s"] / p["step_s"])) for p in picks), default=math.inf)

    lo, hi = math.log(fitting[0]["step_s"]), math.log(fitting[-1]["step_s"])
    spread = k - len(picks)
    for i in range(spread):
        goal = lo + (hi - lo) * i / max(1, spread - 1)
        left = [r for r in fitting if all(r is not p for p in picks)]
        far = [r for r in left if apart(r)]
        picks.append(min(far, key=lambda r: abs(math.log(r["step_s"]) - goal)) if far
                     else max(left, key=gap))  # no plan apart: the least tied one
    return sorted(picks, key=lambda r: r["rank"])


def confirm_cells(spec: PlanSpec, rows: list[dict], k: int) -> list[dict]:
    """The 2 k cells of --confirm (`_picks`), each plan at its micro-batch b (timed) and at
    b + 1 (memory only; a pipeline keeps its micro-batches, of b + 1 sequences), with what was
    planned: the fullest rank's peak (`planned_peak_bytes`), on several ranks each pipeline
    rank's peak and collective bytes per (mesh dimension, op) (`estimate.communication.
    layout_prediction`, keyed 'dim op'), and `sizes`, the micro-batches a replica runs (a
    pipeline: its rows, split by the schedule)."""
    from lmperf.estimate.fit import Workload, rank_peak, timelines
    from lmperf.estimate.communication import layout_prediction
    from lmperf.estimate.fit import shape_of
    from lmperf.estimate.plan import candidate_of
    from lmperf.estimate.simulate import allowance_bytes
    from lmperf.estimate.target import cluster

    work = Workload(spec.size, spec.course, spec.model, spec.context, spec.attention,
                    spec.device, OPTIMIZER[spec.device])
    shape = shape_of(work)
    ranks = cluster(None, spec.gpus, gpus_per_node=spec.gpus_per_node, gib=spec.gib) \
        if spec.gpus > 1 else None
    budget = (spec.gib or 0) * 2**30 or rows[0]["budget_gib"] * 2**30
    cells = []
    for r in _picks(spec, rows, k):
        c = candidate_of(r, spec.gpus)
        lay, per_replica = c.layout, c.layout.local_batch(spec.global_batch)
        m = per_replica // r["micro_batch"]  # a pipeline's micro-batches, b + 1 alike
        for b, timed in ((r["micro_batch"], True), (r["micro_batch"] + 1, False)):
            if lay.pp > 1:
                sizes = [m * b]
            else:
                sizes = lay.micro_batches(spec.global_batch, b) if timed else \
                    [b] * max(1, r["grad_accum"])  # the boundary: b + 1 in every micro-batch
            global_batch = lay.dp * sum(sizes)  # what the cell runs (the plan's, at b)
            cell = {"cell": f"rank{r['rank']}-b{b}", **{f: r[f] for f in CANDIDATE},
                    "runner": runner_of(r, spec), "run_batch": b, "sizes": sizes,
                    "per_replica": per_replica, "timed": timed, "plan_rank": r["rank"],
                    "budget_bytes": budget, "planned_step_s": r["step_s"] if timed else None}
            each = layout_prediction(work, replace(c, micro_batch=b), ranks, global_batch) \
                if ranks is not None else [{"collective_bytes": {}, "peak_bytes": rank_peak(
                    timelines(work, r["precision"], r["checkpoint"]), shape, replace(
                        c, micro_batch=b), spec.context, spec.device, global_batch)[0]}]
            cell["planned_collective_bytes"] = [
                {f"{dim} {op}": v for (dim, op), v in x["collective_bytes"].items()}
                for x in each]
            cell["planned_rank_peak_bytes"] = [x["peak_bytes"] for x in each]
            live = max(cell["planned_rank_peak_bytes"])
            cells.append({**cell, "planned_peak_bytes": live,
                          "allowance_bytes": allowance_bytes(live, spec.device)})
    return cells


def confirm(spec: PlanSpec, rows: list[dict], k: int, timeout: float | None = None,
            search: str = "") -> list[dict]:
    """Run --confirm's cells here: on `spec.gpus` gloo ranks (torchrun), or with one device
    each cell as its own forked job on it (CPU or the GPU at hand); their records, then the
    summary. `search`: the id of the search the cells confirm."""
    from lmperf.core.command import sweep_options
    from lmperf.core.sweep import run_sweep
    from lmperf.core.torchrun import run_job
    from lmperf.results.schema import make_record
    from lmperf.runtime.env import capture

    plan = {**spec.to_dict(), "search": search}
    job = ConfirmJob(world_size=spec.gpus, plan=json.dumps(plan), device=spec.device,
                     cells=json.dumps(confirm_cells(spec, rows, k)),
                     timeout_s=600.0 if timeout is None else timeout,
                     rounds=ROUNDS if spec.gpus > 1 else 1)
    if spec.gpus > 1:
        done = pool_rounds(job.items(), run_job(job),
                           [c["cell"] for c in json.loads(job.cells)])
    else:  # one job per cell: an out-of-memory cell leaves nothing behind for the next
        alone = [ConfirmAlone(**job.with_items([item]).to_full_dict()) for item in job.items()]
        done = run_sweep(alone, None, sweep_options(timeout=job.timeout_s))
        for one, record in zip(alone, done):  # a crashed child's row: the cell's spec too
            record["spec"] = one.item_spec(one.items()[0])
    summary = score([r for r in done if r["status"] == "ok"])
    done.append(make_record("plan", {**plan, "confirm": True, "cell": "summary"},
                            "ok", capture(torch.device("cpu")), metrics=summary))
    return done


def pool_rounds(items: list[str], done: list[dict], cells: list[str]) -> list[dict]:
    """The records of `items` (a ConfirmJob's, in order), one per cell in the order of `cells`,
    each timed cell's later rounds folded into its first: `measured_step_s` the median of every
    round's steps (each the slowest rank's), `round_step_s` each round's median; a later round
    that failed is said in the first's warnings."""
    first = {item: rec for item, rec in zip(items, done) if "@" not in item}
    for item, rec in zip(items, done):
        name, _, r = item.partition("@")
        head = first[name]
        if not r or head["status"] != "ok":
            continue
        if rec["status"] != "ok":
            head["warnings"] = [*head.get("warnings", []),
                                f"round {r}: {rec['status']}: {rec.get('message', '')}"]
            continue
        m = head["metrics"]
        samples = m.setdefault("step_samples_s", _slowest(m["ranks"]))
        samples += _slowest(rec["metrics"]["ranks"])
        m.setdefault("round_step_s", [m["measured_step_s"]]).append(
            rec["metrics"]["measured_step_s"])
        m["measured_step_s"] = statistics.median(samples)
    return [first[name] for name in cells if name in first]


def _slowest(ranks: list[dict]) -> list[float]:
    """Each timed step's slowest rank's seconds."""
    return [max(ts) for ts in zip(*[r["step_s"] for r in ranks])]


def score(cells: list[dict]) -> dict:
    """boundary_correct (fraction of cells whose planned fit equals the measured one),
    peak_error and peak_error_median (the worst and the median |planned - measured| / measured
    peak over every rank of every cell, each rank against its own pipeline rank's plan),
    collective_bytes_error and its median (the same over each rank's collective bytes per mesh
    dimension and op that were measured; None where nothing was), kendall_tau (tau-a of
    planned vs measured step times of the timed cells) and separated_tau (the same over the
    pairs planned more than 2% apart), winner_vs_best (the measured step of the plan ranked
    first over the fastest measured step of the timed cells: 1 when it was the best),
    step_ratio (the median measured / planned step of the timed cells: the time model's miss,
    which a loaded machine inflates) with load_average_1m (the highest of the cells'), and how
    many cells ran a layout (TP, PP)."""
    m = [c["metrics"] for c in cells]
    timed = [x for x in m if x["planned_step_s"] is not None and x["measured_step_s"]]
    steps = [x["measured_step_s"] for x in timed]
    winner = min(timed, key=lambda x: x["planned_step_s"], default=None)  # picks hold rank 1
    peaks = [abs(e) for x in m for e in (x.get("rank_peak_errors") or [x["peak_error"]])
             if e is not None]
    moved = [abs(e) for x in m for rank in x.get("collective_bytes_errors") or []
             for e in rank.values() if e is not None]
    specs = [c["spec"] for c in cells]
    return {"cells": len(m),
            "tp_cells": sum(s.get("tp", 1) > 1 for s in specs),
            "pp_cells": sum(s.get("pp", 1) > 1 for s in specs),
            "boundary_correct": sum(x["planned_fits"] == x["measured_fits"] for x in m) / len(m)
            if m else None,
            "peak_error": max(peaks, default=None),
            "peak_error_median": statistics.median(peaks) if peaks else None,
            "collective_bytes_error": max(moved, default=None),
            "collective_bytes_error_median": statistics.median(moved) if moved else None,
            "kendall_tau": kendall_tau([x["planned_step_s"] for x in timed], steps),
            "separated_tau": separated_tau([x["planned_step_s"] for x in timed], steps),
            "step_ratio": statistics.median(x["measured_step_s"] / x["planned_step_s"]
                                            for x in timed) if timed else None,
            "load_average_1m": max((load for c in cells if (load := (c.get("env") or {}).get(
                "load_average_1m")) is not None), default=None),
            "winner_step_s": winner and winner["measured_step_s"],
            "best_step_s": min(steps, default=None),
            "winner_vs_best": winner and winner["measured_step_s"] / min(steps)}


def kendall_tau(a: list[float], b: list[float]) -> float | None:
    """Kendall's tau-a of two rankings: (concordant - discordant) / pairs."""
    pairs = [(i, j) for i in range(len(a)) for j in range(i + 1, len(a))]
    if not pairs:
        return None
    s = sum(math.copysign(1, (a[i] - a[j]) * (b[i] - b[j])) if (a[i] - a[j]) * (b[i] - b[j])
            else 0 for i, j in pairs)
    return s / len(pairs)


def separated_tau(planned: list[float], measured: list[float]) -> float | None:
    """Somers' d of `measured` on `planned` over the pairs the plan separates: (concordant -
    discordant) / the pairs whose planned figures differ by more than TIE (2%; a pair within it
    is a tie the plan does not rank); None without such a pair."""
    pairs = [(i, j) for i in range(len(planned)) for j in range(i + 1, len(planned))
             if abs(math.log(planned[i] / planned[j])) > TIE]
    if not pairs:
        return None
    return sum(math.copysign(1, (planned[i] - planned[j]) * (measured[i] - measured[j]))
               if measured[i] != measured[j] else 0 for i, j in pairs) / len(pairs)
