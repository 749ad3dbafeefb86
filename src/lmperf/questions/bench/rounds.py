"""Interleaved rounds: the records of one spec's rounds pooled into one record.

`lmperf bench --rounds R` runs the grid R times round-robin (core.sweep), so that slow drift
and a neighbour's burst of load hit every spec alike. Each round's record is kept (append-only,
resumable); this module pools them per spec: the raw samples of every round concatenated, each
sample's round kept beside it, the summary recomputed over all of them, and the between-round
spread (max - min of the round medians, over the pooled median) measured, which is the
part of the noise one run cannot show.
"""

from __future__ import annotations

import copy
import math
import re

from lmperf.measure.stats import summarize

PHASES: tuple[str, ...] = ("forward", "backward", "optimizer", "step")
_ROUND_SUFFIX = re.compile(r"-r\d+$")


def base_id(record: dict) -> str:
    """The job id of a record's spec, without its round suffix."""
    return _ROUND_SUFFIX.sub("", str(record.get("job_id", "")))


def pool_rounds(records: list[dict]) -> list[dict]:
    """One pooled record per spec of the round records in `records` (those with a `round`),
    in the order of the specs' first rounds. A spec any of whose rounds failed pools into its
    first failed record (status and message of that round, `rounds` set)."""
    groups: dict[str, list[dict]] = {}
    for r in records:
        if r.get("kind") == "bench" and "round" in r:
            groups.setdefault(base_id(r), []).append(r)
    return [_pool(jid, sorted(rs, key=lambda r: r["round"])) for jid, rs in groups.items()]


def _pool(jid: str, rounds: list[dict]) -> dict:
    failed = [r for r in rounds if r["status"] != "ok"]
    if failed:
        first = failed[0]
        out = {k: v for k, v in first.items() if k != "round"}
        out["message"] = f"round {first['round']}: {first.get('message', '')}"
        return {**out, "job_id": jid, "rounds": len(rounds)}
    last = rounds[-1]
    metrics = copy.deepcopy(last["metrics"])
    _pool_phases(metrics, [r["metrics"] for r in rounds], [r["round"] for r in rounds])
    if metrics.get("cpu_time"):  # the CPU times of the same steps, pooled alike
        cpus = [r["metrics"].get("cpu_time") or {} for r in rounds]
        _pool_phases(metrics["cpu_time"], cpus, [r["round"] for r in rounds])
    step_s = metrics["step_ms"]["median"] / 1e3
    if step_s > 0:  # the derived figures follow the pooled median step
        metrics["tokens_per_s"] = metrics["tokens_per_step"] / step_s
        if metrics.get("flops_per_step") is not None:
            metrics["tflops"] = metrics["flops_per_step"] / step_s / 1e12
        if metrics.get("peak_tflops"):
            metrics["mfu"] = metrics["tflops"] / metrics["peak_tflops"]
    warnings = list(dict.fromkeys(w for r in rounds for w in r.get("warnings", [])))
    out = {k: v for k, v in last.items() if k != "round"}
    return {**out, "metrics": metrics, "warnings": warnings, "job_id": jid, "rounds": len(rounds)}


def _pool_phases(out: dict, per_round: list[dict], numbers: list[int]) -> None:
    """Replace each '<phase>_ms' summary of `out` by the pool of the rounds' (`per_round`,
    in round order, numbered `numbers`): their samples concatenated with each sample's round,
    the round medians and their spread. A phase missing from a round is left as it was."""
    for phase in PHASES:
        key = f"{phase}_ms"
        if not out.get(key) or not all(m.get(key) for m in per_round):
            continue
        samples, which, medians = [], [], []
        for m, k in zip(per_round, numbers):
            xs = m[key]["samples"]
            samples += xs
            which += [k] * len(xs)
            medians.append(m[key]["median"])
        pooled = summarize(samples)
        pooled["sample_round"] = which
        pooled["round_medians"] = medians
        spread = max(medians) - min(medians)
        # over the pooled median; a count whose median is 0 (faults) has a spread only if 0
        pooled["round_spread"] = (spread / pooled["median"] if pooled["median"]
                                  else (0.0 if spread == 0 else math.nan))
        out[key] = pooled


def latest_view(records: list[dict]) -> list[dict]:
    """The records to show: round records are left out where their pooled record is present."""
    pooled = {base_id(r) for r in records if "rounds" in r}
    return [r for r in records if not ("round" in r and base_id(r) in pooled)]
