"""Predicted vs measured communication per training step: the messages the profiler counted in a
step, costed by `estimate.comm` at this machine's fitted `dist comm` curve, beside the
communication measured on the rank with the least of it (docs/commands/dist.md)."""

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
