"""`lmperf plan` against torchtitan's published Llama 3 training runs: each run evaluated as one
configuration (every layout dimension given) on its GPU entry; predicted tokens/s per GPU and
peak (with the CUDA allowance) beside the published figures, and their ratios.

    python scripts/check_plan_published.py [--runs T5a T5b ...]

The runs: tests/data/published/torchtitan_llama3_h100.csv (its header says where each figure
comes from). Runs nothing on a GPU: seconds per run on a CPU (the deep models' timelines are
grown from shallow ones).
"""

from __future__ import annotations

import argparse
import csv
from functools import lru_cache
from pathlib import Path

import pandas as pd

FACTS = Path(__file__).resolve().parents[1] / "tests/data/published/torchtitan_llama3_h100.csv"
CHECKPOINT = ("none", "full", "op")


def facts() -> dict[str, dict]:
    """run id -> its published row (strings, as the CSV has them)."""
    lines = [line for line in FACTS.read_text().splitlines() if not line.startswith("#")]
    return {row["id"]: row for row in csv.DictReader(lines)}


def priced(run: str) -> bool:
    """Whether the plan prices everything run `run` used."""
    return facts()[run]["checkpoint"] in CHECKPOINT


@lru_cache(maxsize=None)
def predicted(run: str) -> dict:
    """The plan's row of published run `run`, every dimension given (bf16-fsdp, torchtitan's
    precision)."""
    from lmperf.estimate import plan
    from lmperf.estimate.fit import Workload, shape_of
    from lmperf.estimate.target import cluster

    r = facts()[run]
    work = Workload(r["size"], "2026", None, int(r["context"]), "sdpa", "cuda", "fused")
    space = plan.Space(("bf16-fsdp",), (r["checkpoint"],), ("fsdp",),
                       tp=(int(r["tp"]),), pp=(int(r["pp"]),), cp=(int(r["cp"]),),
                       dp_replicate=(1,),
                       pp_schedule=(r["pp_schedule"],) if r["pp_schedule"] else None,
                       pp_virtual=(int(r["pp_virtual"]),), micro_batch=(int(r["micro_batch"]),),
                       async_tp=(r["async_tp"] == "on",), compile=(r["compile"] == "on",),
                       float8=(r["float8"],))
    rows, left = plan.candidates(work, shape_of(work), cluster(r["gpu"], int(r["gpus"])),
                                 int(r["global_batch"]), space)
    if len(rows) != 1:
        raise ValueError(f"{run}: {len(rows)} candidates; {plan.left_out_lines(left)}")
    return rows[0]


def check(runs: list[str] | None = None) -> pd.DataFrame:
    """One row per run: published and predicted tokens/s per GPU and memory, their ratios, and
    whether the plan prices all the run used."""
    out = []
    for run in runs or list(facts()):
        r, p = facts()[run], predicted(run)
        memory = float(r["memory_gib"]) if r["memory_gib"] else None
        out.append({"run": run, "size": r["size"], "gpus": int(r["gpus"]),
                    "priced": priced(run), "published": float(r["tokens_per_s"]),
                    "predicted": p["tokens_per_s_per_gpu"],
                    "ratio": p["tokens_per_s_per_gpu"] / float(r["tokens_per_s"]),
                    "memory_gib": memory, "peak_gib": p["peak_gib"],
                    "memory_ratio": p["peak_gib"] / memory if memory else None,
                    "fits": p["fits"]})
    return pd.DataFrame(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", help="run ids (default: every run)")
    df = check(parser.parse_args().runs)
    print(df.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    priced_ = df[df["priced"]]
    if len(priced_):
        print(f"runs the plan prices whole: median |ratio - 1| "
              f"{(priced_['ratio'] - 1).abs().median():.1%}")


if __name__ == "__main__":
    main()
