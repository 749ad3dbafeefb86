"""A plan request -> one 'plan' record per candidate of `lmperf.estimate.plan`'s search (every
figure PREDICTED, said in its method); `--confirm K` -> 2 K cells run on ranks, then scored."""

from __future__ import annotations

import json
import math
import time

import torch

from lmperf.errors import SpecError
from lmperf.questions.plan.spec import RUNNABLE_ON_CPU, ConfirmJob, PlanSpec

METHOD = ("PREDICTED, not measured: per-rank peak from two simulated steps weighted by what the "
          "strategy keeps (lmperf.estimate.fit); step time from per-op counts on the target and "
          "each collective's latency + bandwidth (estimate.time_model, estimate.comm)")
CANDIDATE = ("precision", "checkpoint", "strategy", "tp", "micro_batch", "grad_accum")


def search(spec: PlanSpec) -> tuple[list[dict], dict, str]:
    """(ranked candidate rows, env, what the target is) of `spec`."""
    from lmperf.estimate.fit import Workload
    from lmperf.estimate.plan import candidates, shape_of
    from lmperf.estimate.target import cluster
    from lmperf.runtime.env import capture

    device = spec.device
    work = Workload(spec.size, spec.course, spec.model, spec.context, spec.attention, device,
                    "foreach" if device == "cpu" else "fused")
    target = cluster(spec.gpu, spec.gpus, gpus_per_node=spec.gpus_per_node, gib=spec.gib,
                     host_us=spec.host_us)
    rows = candidates(work, shape_of(work), target, spec.global_batch, spec.checkpoints,
                      spec.precisions, RUNNABLE_ON_CPU if device == "cpu" else None)
    if not rows:
        raise SpecError(f"nothing to plan: global batch {spec.global_batch} does not split over "
                        f"the data-parallel degrees of {spec.gpus} devices (or no --checkpoint "
                        "group applies to this model): give a multiple of the devices")
    return rows, capture(torch.device("cpu")), \
        f"{spec.gpus} x {target.name}, {target.budget / 2**30:.3g} GiB each"


def records(spec: PlanSpec) -> list[dict]:
    """One 'plan' record per candidate evaluated, fitting or not (ranked)."""
    from lmperf.results.schema import make_record

    t0 = time.perf_counter()
    rows, env, target = search(spec)
    took = time.perf_counter() - t0
    out = []
    for row in rows:
        metrics = {k: v for k, v in row.items() if k not in CANDIDATE}
        metrics.update(method=METHOD, target=target, search_s=took)
        out.append(make_record("plan", {**spec.to_dict(), **{k: row[k] for k in CANDIDATE}},
                               "ok", env, metrics=metrics))
    return out


def command(spec: dict, row) -> str:
    """The command that runs a planned candidate (`row`) of a plan (`spec`, its record's) with
    what lmperf has."""
    from lmperf.model.presets import require_plain

    runner = {"ddp": "torch-ddp", "zero1": "torch-zero1", "fsdp": "fsdp2"}.get(row["strategy"])
    try:
        require_plain(spec["size"], spec["course"], "dist train")
    except SpecError:
        runner = None
    if runner is None or row["tp"] > 1 or spec["model"]:
        model = f"--model {spec['model']} " if spec["model"] else ""
        return (f"(lmperf dist train does not run {row['strategy']} on this model: torchtitan "
                f"does; `lmperf bench {model}--size {spec['size'] or 'SIZE'} --batch "
                f"{row['micro_batch']} --context {spec['context']}` times one rank's micro-batch)")
    todo = ([f"x{row['grad_accum']} gradient accumulation"] if row["grad_accum"] > 1 else []) \
        + ([f"checkpoint groups of {row['checkpoint']}"] if row["checkpoint"] else []) \
        + (["bf16 autocast"] if row["precision"] == "bf16-mixed" else [])
    return (f"lmperf dist train --world-size {spec['gpus']} --strategy {runner} --size "
            f"{spec['size']} --context {spec['context']} --batch {row['micro_batch']}"
            + (" --compute-dtype bf16" if row["precision"] == "bf16-fsdp" else " --bucket-mb 25")
            + (f"  (not flags of dist train yet: {', '.join(todo)})" if todo else ""))


def confirm_cells(spec: PlanSpec, rows: list[dict], k: int) -> list[dict]:
    """The 2 k cells of --confirm: k fitting plans spread over the ranking's predicted times,
    each at its micro-batch b (timed) and at b + 1 (memory only)."""
    fitting = [r for r in rows if r["fits"]]
    if k > len(fitting):
        raise SpecError(f"--confirm {k}: only {len(fitting)} candidate(s) fit")
    # spread over the predicted times (log-spaced from the fastest to the slowest), not over
    # rank positions: two plans predicted 2% apart rank by the machine's noise, not the model
    lo, hi = math.log(fitting[0]["step_s"]), math.log(fitting[-1]["step_s"])
    picks: list[dict] = []
    for i in range(k):
        goal = lo + (hi - lo) * i / max(1, k - 1)
        left = [r for r in fitting if all(r is not p for p in picks)]
        picks.append(min(left, key=lambda r: abs(math.log(r["step_s"]) - goal)))
    picks.sort(key=lambda r: r["rank"])
    from lmperf.estimate.fit import Workload, rank_peak, timelines
    from lmperf.estimate.plan import shape_of

    work = Workload(spec.size, spec.course, spec.model, spec.context, spec.attention, "cpu",
                    "foreach")
    shape = shape_of(work)
    cells = []
    for r in picks:
        per_replica = spec.global_batch // (spec.gpus // r["tp"])
        for b, timed in ((r["micro_batch"], True), (r["micro_batch"] + 1, False)):
            live, _ = rank_peak(timelines(work, r["precision"], r["checkpoint"]), shape,
                                r["strategy"], spec.gpus, r["tp"], b, r["grad_accum"], r["precision"],
                                "cpu", spec.context, readable=True)
            cells.append({"cell": f"rank{r['rank']}-b{b}", **{c: r[c] for c in CANDIDATE},
                          "run_batch": b, "per_replica": per_replica, "timed": timed,
                          "plan_rank": r["rank"], "planned_peak_bytes": live,
                          "budget_bytes": spec.gib * 2**30,
                          "planned_step_s": r["step_s"] if timed else None})
    return cells


def confirm(spec: PlanSpec, rows: list[dict], k: int, timeout: float | None = None) -> list[dict]:
    """Run --confirm's cells on `spec.gpus` gloo ranks here; their records and the summary."""
    from lmperf.core.torchrun import run_job
    from lmperf.results.schema import make_record
    from lmperf.runtime.env import capture

    job = ConfirmJob(world_size=spec.gpus, plan=json.dumps(spec.to_dict()),
                     cells=json.dumps(confirm_cells(spec, rows, k)),
                     timeout_s=600.0 if timeout is None else timeout)
    done = run_job(job)
    summary = score([r for r in done if r["status"] == "ok"])
    done.append(make_record("plan", {**spec.to_dict(), "confirm": True, "cell": "summary"},
                            "ok", capture(torch.device("cpu")), metrics=summary))
    return done


def score(cells: list[dict]) -> dict:
    """boundary_correct (fraction of cells whose planned fit equals the measured one),
    peak_error (the worst |planned - measured| / measured peak), kendall_tau (planned vs
    measured step times of the timed cells)."""
    m = [c["metrics"] for c in cells]
    timed = [x for x in m if x["planned_step_s"] is not None and x["measured_step_s"]]
    return {"cells": len(m),
            "boundary_correct": sum(x["planned_fits"] == x["measured_fits"] for x in m) / len(m)
            if m else None,
            "peak_error": max((abs(x["peak_error"]) for x in m), default=None),
            "kendall_tau": kendall_tau([x["planned_step_s"] for x in timed],
                                       [x["measured_step_s"] for x in timed])}


def kendall_tau(a: list[float], b: list[float]) -> float | None:
    """Kendall's tau-a of two rankings: (concordant - discordant) / pairs."""
    pairs = [(i, j) for i in range(len(a)) for j in range(i + 1, len(a))]
    if not pairs:
        return None
    s = sum(math.copysign(1, (a[i] - a[j]) * (b[i] - b[j])) if (a[i] - a[j]) * (b[i] - b[j])
            else 0 for i, j in pairs)
    return s / len(pairs)
