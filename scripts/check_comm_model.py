"""lmperf.estimate.comm against what `lmperf dist` measures on this machine (gloo, torchrun).

    python scripts/check_comm_model.py [--world-size 2 4] [--iters 10] [--keep DIR]

1. `lmperf dist comm` at 2 and 4 ranks, all_reduce, all_gather, reduce_scatter and broadcast at
   1 KiB, 4 KiB, ..., 64 MiB (x4 steps). Per (collective, ranks), alpha and W are fitted on every
   other size (1, 16, 256 KiB, 4, 64 MiB) and the sizes between are predicted: the relative error
   |predicted - measured| / measured, its median and worst per row and overall.
2. `lmperf dist train` at 2 ranks (tiny model; flat, bucketed): the messages the profiler
   counted per step (calls and bytes per collective) costed with the fits on all sizes, against
   the measured communication (the rank with the least of it), and exposed_seconds' prediction
   against the measured exposed communication;
   `curve` is `prediction_table`'s figure for the same messages (each read off the
   measured time-vs-size curve, no formula), to tell the formula's error from the gap between
   a collective timed alone and one inside a training step.
Writes nothing into the repository (records go to a temporary folder, or to --keep DIR).
About 2-3 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from lmperf.estimate.comm import (BACKWARD_SHARE, collective_seconds, exposed_seconds,
                                  fit_from_records)

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
SIZES = [2**k for k in range(10, 27, 2)]  # 1 KiB .. 64 MiB
OVERLAP = {"flat": 0.0, "naive": 0.0, "bucketed": BACKWARD_SHARE,
           "overlap": BACKWARD_SHARE, "torch-ddp": BACKWARD_SHARE}


def prediction_table(records: list[dict]) -> pd.DataFrame:
    """Predicted vs measured communication per training step (each counted message costed at
    this machine's fitted `dist comm` curve): one row per training run with matching `dist comm`
    records (empty when there are none)."""
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


def lmperf(*args: str, out: Path) -> list[dict]:
    """Run `python -m lmperf dist ARGS --out OUT` and return its records."""
    cmd = [sys.executable, "-m", "lmperf", "dist", *args, "--out", str(out), "--no-plots"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n"
                 f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def held_out(records: list[dict]) -> list[dict]:
    """Fit on every other size, predict the rest: one row per predicted record."""
    fit_sizes = set(SIZES[::2])
    comm = [r for r in records if r["spec"].get("what") == "comm" and r["status"] == "ok"]
    fits = fit_from_records([r for r in comm if r["spec"]["size_bytes"] in fit_sizes])
    rows = []
    for r in comm:
        s, m = r["spec"], r["metrics"]
        if s["size_bytes"] in fit_sizes:
            continue
        key = (s["collective"], s["world_size"])
        predicted = collective_seconds(key[0], m["bytes"], key[1], fits[key], "ring") * 1e3
        measured = m["time_ms"]["median"]
        rows.append({"key": key, "bytes": m["bytes"], "predicted_ms": predicted,
                     "measured_ms": measured, "error": abs(predicted - measured) / measured,
                     "alpha_us": fits[key].base_us, "gbps": fits[key].intra_gbps})
    return rows


def train_rows(records: list[dict], fits: dict) -> list[dict]:
    """Predicted vs measured communication (and exposed) per step of each train record."""
    rows = []
    for r in records:
        s, m = r["spec"], r["metrics"]
        if s.get("what") != "train" or r["status"] != "ok" or not m.get("comm"):
            continue
        n, moved = s["world_size"], m["bytes"]["collectives"]
        per_call = {c: v["bytes"] / v["calls"] for c, v in moved.items() if v["calls"]}
        one = {c: collective_seconds(c, size, n, fits[(c, n)], "ring")
               for c, size in per_call.items()}
        comm_s = sum(moved[c]["calls"] * t for c, t in one.items())
        last_s = max(one.values())  # the last message (bucket) issued: never hidden
        compute_s = (m["forward_ms"]["median"] + m["backward_ms"]["median"]) / 1e3
        rank = min(m["comm"]["per_rank"], key=lambda p: p["comm_ms"])
        exposed = exposed_seconds(comm_s, compute_s, OVERLAP.get(s["strategy"], 0.0), last_s)
        rows.append({"strategy": s["strategy"], "n": n,
                     "calls": sum(v["calls"] for v in moved.values()),
                     "mb": sum(v["bytes"] for v in moved.values()) / 1e6,
                     "pred_comm": comm_s * 1e3, "comm": rank["comm_ms"],
                     "pred_exposed": exposed * 1e3, "exposed": rank["exposed_ms"]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-size", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--strategy", nargs="+", default=["flat", "bucketed"])
    ap.add_argument("--keep", type=Path,
                    help="write the records here instead of a temporary folder")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        comm = lmperf("comm", "--world-size", *map(str, args.world_size), "--collective",
                      *COLLECTIVES, "--sizes", *map(str, SIZES), "--iters", str(args.iters),
                      "--warmup", "3", out=folder / "comm.jsonl")
        train = lmperf("train", "--world-size", "2", "--size", "tiny", "--strategy",
                       *args.strategy, out=folder / "train.jsonl")

    rows = held_out(comm)
    print(f"1. dist comm: fit on {[s // 1024 for s in SIZES[::2]]} KiB, predict "
          f"{[s // 1024 for s in SIZES[1::2]]} KiB (ring formula, alpha + S f / W)")
    print(f"{'collective':<15}{'n':>3}{'alpha us':>10}{'W GB/s':>9}{'points':>8}{'median':>8}"
          f"{'worst':>8}")
    for key in sorted({r["key"] for r in rows}, key=lambda k: (k[1], COLLECTIVES.index(k[0]))):
        errs = [r["error"] for r in rows if r["key"] == key]
        first = next(r for r in rows if r["key"] == key)
        print(f"{key[0]:<15}{key[1]:>3}{first['alpha_us']:>10.0f}{first['gbps']:>9.3f}"
              f"{len(errs):>8}{statistics.median(errs):>8.0%}{max(errs):>8.0%}")
    errs = [r["error"] for r in rows]
    worst = max(rows, key=lambda r: r["error"])
    print(f"all: n = {len(errs)}, median {statistics.median(errs):.0%}, worst {max(errs):.0%} "
          f"({worst['key'][0]} n={worst['key'][1]} {worst['bytes']} B: predicted "
          f"{worst['predicted_ms']:.3f} ms, measured {worst['measured_ms']:.3f} ms)")

    print("\n2. dist train (tiny, 2 ranks): per step, predicted from the counted messages with "
          "the fits on all sizes; measured on the rank with the least communication")
    print(f"{'strategy':<10}{'n':>3}{'calls':>6}{'MB':>7}{'comm pred':>11}{'curve':>7}{'meas':>8}"
          f"{'ratio':>7}{'exposed pred':>14}{'meas':>8}{'ratio':>7}")
    curve = prediction_table(comm + train)
    curve = dict(zip(curve["strategy"], curve["predicted_ms"])) if len(curve) else {}
    for t in train_rows(train, fit_from_records(comm)):
        print(f"{t['strategy']:<10}{t['n']:>3}{t['calls']:>6}{t['mb']:>7.2f}{t['pred_comm']:>11.2f}"
              f"{curve.get(t['strategy'], float('nan')):>7.2f}"
              f"{t['comm']:>8.2f}{t['comm'] / t['pred_comm']:>7.2f}{t['pred_exposed']:>14.2f}"
              f"{t['exposed']:>8.2f}{t['exposed'] / max(t['pred_exposed'], 1e-9):>7.2f}")
    print("ratio = measured / predicted; ms per step; overlap assumed: "
          + ", ".join(f"{k} {v:.2f}" for k, v in OVERLAP.items() if k in args.strategy))


if __name__ == "__main__":
    main()
