"""Predicted vs measured communication per training step, from what `dist comm` measured.

For each strategy run that has `dist comm` records at the same world size, backend and dtype,
the messages the profiler counted in a training step (collective, calls, bytes) are costed two
ways and set beside the communication time measured in the profiled steps:

- per message: calls x t(S), t read off the measured time-vs-size curve of that collective
  (log-log interpolation between measured sizes; below the smallest size its time, above the
  largest its bandwidth), which keeps each message's latency;
- at peak busbw: bus bytes / the best busbw measured for that collective, the model of
  `lmperf dist --estimate` with W set to what this machine reached.
The measured time is the length of the union of communication intervals (lmperf.questions.parallel.accounting)
on the rank with the LEAST of it: a collective on the rank that arrives last is the transfer
itself, while on the others it also holds the wait for that rank (shown as
`waiting_rank_comm_ms`; `dist comm` lines the ranks up with a barrier, training does not).
Collectives that overlap each other count once, so a prediction that sums them can exceed it.
"""

from __future__ import annotations

import math

import pandas as pd


def _curves(records: list[dict]) -> dict[tuple, list[tuple[float, float, float]]]:
    """(collective, world size, backend, dtype) -> sorted [(bytes, time ms, busbw GB/s)]."""
    curves: dict[tuple, list[tuple[float, float, float]]] = {}
    for r in records:
        s, m = r["spec"], r.get("metrics") or {}
        if s.get("what") != "comm" or r["status"] != "ok":
            continue
        key = (s["collective"], s["world_size"], s["backend"], s["dtype"])
        curves.setdefault(key, []).append((m["bytes"], m["time_ms"]["median"], m["busbw_gbps"]))
    return {k: sorted(v) for k, v in curves.items()}


def time_at(curve: list[tuple[float, float, float]], size: float) -> float:
    """Milliseconds for one message of `size` bytes on a measured (bytes, ms, busbw) curve."""
    sizes = [c[0] for c in curve]
    if size <= sizes[0]:
        return curve[0][1]
    if size >= sizes[-1]:
        return curve[-1][1] * size / sizes[-1]
    for (s0, t0, _), (s1, t1, _) in zip(curve, curve[1:]):
        if s0 <= size <= s1:
            f = (math.log(size) - math.log(s0)) / (math.log(s1) - math.log(s0))
            return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
    return math.nan  # unreachable: the sizes are sorted


def prediction_table(records: list[dict]) -> pd.DataFrame:
    """One row per training run with matching `dist comm` curves (empty when there are none)."""
    curves = _curves(records)
    rows = []
    for r in records:
        s, m = r["spec"], r.get("metrics") or {}
        if s.get("what") != "train" or r["status"] != "ok" or not m.get("comm"):
            continue
        moved = (m.get("bytes") or {}).get("collectives") or {}
        per_message = peak = 0.0
        missing = []
        for collective, c in moved.items():
            curve = curves.get((collective, s["world_size"], s["backend"], "fp32"))
            if not curve or not c["calls"]:
                missing.append(collective)
                continue
            per_message += c["calls"] * time_at(curve, c["bytes"] / c["calls"])
            peak += c["bus_bytes"] / (max(b for _, _, b in curve) * 1e9) * 1e3
        if not moved or missing:
            continue
        per_rank = [p["comm_ms"] for p in m["comm"]["per_rank"]]
        measured = min(per_rank)
        rows.append({"strategy": s["strategy"], "world_size": s["world_size"],
                     "messages": sum(c["calls"] for c in moved.values()),
                     "bus_mb": sum(c["bus_bytes"] for c in moved.values()) / 1e6,
                     "measured_comm_ms": measured, "waiting_rank_comm_ms": max(per_rank),
                     "predicted_ms": per_message,
                     "predicted_peak_busbw_ms": peak,
                     "measured_over_predicted": measured / per_message if per_message else math.nan})
    return pd.DataFrame(rows)
