"""Predicted vs measured communication per training step, from what `dist comm` measured.

For each strategy run with `dist comm` records at the same world size and backend, the messages
the profiler counted in a training step (collective, calls, bytes) are costed by the one
collective model, `lmperf.estimate.comm`, with latency and bandwidth fitted to this machine's
`dist comm` curve of that collective (fp32), and set beside the communication measured in the
profiled steps: the union of communication intervals on the rank with the LEAST of it (on the
others a collective also holds the wait for the last rank to arrive, shown as
`waiting_rank_comm_ms`). Collectives that overlap each other count once there, so a
prediction that sums them can exceed it.
"""

from __future__ import annotations

import math

import pandas as pd


def prediction_table(records: list[dict]) -> pd.DataFrame:
    """One row per training run with matching `dist comm` records (empty when there are none)."""
    from lmperf.estimate.comm import collective_seconds, fit_from_records

    fp32 = {}
    for r in records:  # the curves by backend: each backend's own fit
        s = r["spec"]
        if s.get("what") == "comm" and s.get("dtype") == "fp32":
            fp32.setdefault(s["backend"], []).append(r)
    links = {b: fit_from_records(rs) for b, rs in fp32.items()}
    rows = []
    for r in records:
        s, m = r["spec"], r.get("metrics") or {}
        if s.get("what") != "train" or r["status"] != "ok" or not m.get("comm"):
            continue
        moved = (m.get("bytes") or {}).get("collectives") or {}
        fits = links.get(s["backend"], {})
        if not moved or any((c, s["world_size"]) not in fits for c in moved):
            continue
        predicted = sum(c["calls"] * collective_seconds(
            name, c["bytes"] / c["calls"], s["world_size"], fits[(name, s["world_size"])],
            "ring") for name, c in moved.items() if c["calls"]) * 1e3
        per_rank = [p["comm_ms"] for p in m["comm"]["per_rank"]]
        rows.append({"strategy": s["strategy"], "world_size": s["world_size"],
                     "messages": sum(c["calls"] for c in moved.values()),
                     "bus_mb": sum(c["bus_bytes"] for c in moved.values()) / 1e6,
                     "measured_comm_ms": min(per_rank), "waiting_rank_comm_ms": max(per_rank),
                     "predicted_ms": predicted,
                     "measured_over_predicted": min(per_rank) / predicted if predicted
                     else math.nan})
    return pd.DataFrame(rows)
