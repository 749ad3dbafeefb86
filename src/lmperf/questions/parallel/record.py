"""The record of one `dist train` item, from every rank's results (rank 0 builds it): times
(the slowest rank per step), communication from the profiled steps, the collectives and the
peak of live bytes of each rank (the counted step), what each rank holds, and the check against
one process. Its per-rank figures are shaped to be held against a plan's prediction of the same
layout: `collective_bytes` {collective: [bytes per step, rank 0, 1, ...]} (S, as nccl-tests
defines it), `peak_live_bytes` [rank 0, 1, ...].
"""

from __future__ import annotations

import statistics

from lmperf.measure.stats import summarize
from lmperf.measure.throughput import tokens_per_s
from lmperf.questions.parallel import strategies
from lmperf.questions.parallel.items import Item
from lmperf.questions.parallel.spec import SHARDED, TrainJob

PHASES: tuple[str, ...] = ("forward", "backward", "sync", "optimizer")
LEDGER = ("a dispatch mode over one untimed step (questions/parallel/ledger.py): each "
          "collective's process group and tensors as the op received them; bytes per rank "
          "per step, S as nccl-tests defines it")


def payload(job: TrainJob, item: Item, ranks: list[dict], check: dict, groups: dict,
            replicas: int, extra: dict) -> dict:
    """The record's fields (`params`, `metrics`, `warnings`) of `item` from every rank's
    results; `replicas`: the data-parallel degree (the global batch's replicas); `extra`: what
    the layout adds (the pipeline's schedule and idle slots)."""
    per_step = lambda phase: [max(col) for col in zip(*(r["samples"][phase] for r in ranks))]  # noqa: E731
    metrics: dict = {"timer": "cuda_event" if job.device == "cuda" else "perf_counter"}
    for phase in (*PHASES, "step"):
        metrics[f"{phase}_ms"] = summarize(per_step(phase))
    metrics["per_rank_step_ms"] = [r["samples"]["step"] for r in ranks]
    metrics["tokens_per_s"] = tokens_per_s(replicas * job.batch * job.grad_accum * job.context,
                                           metrics["step_ms"])
    compute_dtype = job.compute_dtype if item.strategy in SHARDED and not item.is_layout else "fp32"
    metrics["compute_dtype"] = compute_dtype
    metrics["comm"] = _comm(ranks)
    counted = metrics["comm"].pop("bytes", {}) if metrics["comm"] else {}
    ledger = [r["collectives"] for r in ranks]
    if item.is_layout:  # the profiler's gloo events know no group: the ledger's bus bytes
        metrics["bytes"] = {"param_elements": groups, "counted_bus_bytes": max(
            sum(row["bus_bytes"] for row in rows) for rows in ledger), "source": "ledger"}
    else:
        messages = strategies.analytic_messages(item.strategy, groups,
                                                compute_dtype=compute_dtype, accum=job.grad_accum)
        n = len(ranks)
        metrics["bytes"] = {"analytic_bus_bytes": strategies.analytic_bus_bytes(messages, n),
                            "analytic_backend_bus_bytes": strategies.analytic_bus_bytes(
                                messages, n, job.backend),
                            "analytic_messages": messages, "param_elements": groups, **counted}
    metrics["collective_bytes"] = collective_bytes(ledger)
    metrics["collectives"] = {"per_rank": ledger, "source": LEDGER, "profiler_calls": [
        {c: v["calls"] for c, v in r["accounting"]["steps"][0]["collectives"].items()}
        if r["accounting"] else None for r in ranks]}  # as the backend ran them
    metrics["peak_live_bytes"] = [r["held"].get("peak_live_bytes") for r in ranks]
    metrics["memory"] = {"per_rank": [r["held"] for r in ranks],
                         "unit": "bytes (counted), MiB (peak)"}
    if item.is_layout:
        metrics.update(extra)
        _check_loss(check, ranks)
    metrics["correctness"] = check
    return {"params": groups["total"], "metrics": metrics, "warnings": _warnings(check)}


def collective_bytes(ledger: list[list[dict]]) -> dict[str, list[int]]:
    """{collective: [S bytes per step on rank 0, 1, ...]} from each rank's ledger rows (every
    mesh dimension summed; the rows keep them apart)."""
    names = sorted({row["collective"] for rows in ledger for row in rows})
    return {c: [sum(r["bytes"] for r in rows if r["collective"] == c) for rows in ledger]
            for c in names}


def _check_loss(check: dict, ranks: list[dict]) -> None:
    """The first step's loss (the mean over the data-parallel replicas of each replica's loss,
    read where it is: the last pipeline stage) against the reference's, into `check`."""
    loss = check.get("loss")
    if loss is None:
        return
    by_replica = {r["replica"]: r["first_loss"] for r in ranks if r["first_loss"] is not None}
    value = statistics.fmean(by_replica.values())
    diff = abs(value - loss["reference"])
    loss.update(value=value, abs_diff=diff, equal=diff <= loss["rtol"] * abs(loss["reference"]))
    check["equal"] = check["equal"] and loss["equal"]


def _warnings(check: dict) -> list[str]:
    """One line per part of the check that failed: parameters, gradients, loss."""
    if check["equal"] is not False:
        return []
    out = []
    for what, part in (("parameters", check), ("first step's gradients", check.get("gradients"))):
        if part and not part["equal"]:
            out.append(f"{what} differ from the single-process reference by up to "
                       f"{part['max_abs_diff']:.3g} ({part['worst']}), beyond atol "
                       f"{part['atol']:g} + rtol {part['rtol']:g}")
    loss = check.get("loss")
    if loss and loss.get("equal") is False:
        out.append(f"first step's loss {loss['value']:.7g} differs from the single-process "
                   f"reference's {loss['reference']:.7g} beyond rtol {loss['rtol']:g}")
    return out


def _comm(ranks: list[dict]) -> dict | None:
    """Comm / compute / overlap / exposed: each rank's means over its profiled steps (a mean
    keeps exposed = comm - overlap), and the figures of the rank with the most exposed
    communication (the one the step waits on); bytes are rank 0's."""
    if not ranks[0]["accounting"]:
        return None
    keys = ("comm_ms", "compute_ms", "overlap_ms", "exposed_ms")
    per_rank = [{k: statistics.fmean(s[k] for s in r["accounting"]["steps"]) for k in keys}
                for r in ranks]
    worst = max(range(len(per_rank)), key=lambda i: per_rank[i]["exposed_ms"])
    steps0 = ranks[0]["accounting"]["steps"]
    acct0 = ranks[0]["accounting"]
    return {"source": acct0["source"], "note": acct0.get("note"), "rank": worst,
            **per_rank[worst], "per_rank": per_rank,
            "unattributed_kernels": [r["accounting"].get("unattributed_kernels", 0) for r in ranks],
            "bytes": {"counted_bus_bytes": statistics.median(s["bus_bytes"] for s in steps0),
                      "collectives": steps0[0]["collectives"]}}
