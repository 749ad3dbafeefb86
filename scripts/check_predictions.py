"""`bench --predict` against a published table of measured step times: the error of every cell,
and the host time per op each host-bound cell implies.

    python scripts/check_predictions.py [TABLE.csv] [--gpu A100-80GB] [--host-us 5 | --host-us records]
    python scripts/check_predictions.py tests/data/published/h200_small_2026-11-27.csv --host-us records

TABLE.csv (default: the seeds' A100 fp32 table, tests/data/published/) has columns size,
context, forward_s, backward_s and optionally precision (default fp32), attention (default
naive) and step_s; comment lines start with '#' and may name `course: 2025`, `batch: 4`,
`mode: train-step` (default forward-backward), `gpu: H200`. `--host-us records`: the host time
the table's own host-bound steps imply (`derive_host_us`). Prints one row per (cell, phase): predicted,
measured, ratio and the bound, then the median absolute error, the worst ratios (all sizes, and
medium and up) and, for cells predicted too fast, the host time per op that would make the
prediction equal the measurement. Runs nothing on a GPU: seconds on a CPU.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np
import pandas as pd

from lmperf.questions.bench import predict as pr
from lmperf.estimate.op_costs import count_op_costs
from lmperf.estimate.time_model import phase_times

DEFAULT = Path(__file__).resolve().parents[1] / "tests/data/published/a100_fp32_cs336_2025.csv"
PHASES = ("forward", "backward")


def table_meta(path: Path) -> dict[str, str]:
    """`key: value` pairs from the table's comment lines."""
    lines = [ln.lstrip("# ").strip() for ln in path.read_text().splitlines() if ln.startswith("#")]
    return dict(m.groups() for ln in lines if (m := re.match(r"(\w+): (\S+)$", ln)))


def _cells(path: Path, gpu: str | None, max_context: int):
    """(gpu, [(table row, its op costs)]) of a table."""
    meta = table_meta(path)
    table = pd.read_csv(path, comment="#")
    table = table[table["context"] <= max_context]
    for column, default in (("precision", "fp32"), ("attention", "naive")):
        if column not in table:
            table[column] = default
    gpu = gpu or meta.get("gpu", "A100-80GB")
    cells = []
    for cell in table.itertuples():
        (spec,) = pr.plan_predictions([gpu], size=cell.size, context=int(cell.context),
                                      precision=cell.precision, attention=cell.attention,
                                      mode=meta.get("mode", "forward-backward"),
                                      batch=int(meta.get("batch", 4)),
                                      course=meta.get("course", "2025"))
        cells.append((cell, count_op_costs(spec)))
    return gpu, cells


def derive_host_us(path: Path, gpu: str | None = None) -> float:
    """The host time per op (us) a table's own records imply: the median, over its steps that
    the default predicts host-bound, of measured step / op calls per step (the host issued
    every op; the device waited)."""
    gpu, cells = _cells(path, gpu, 10**9)
    target = pr.gpu_targets(gpu)[0]
    implied = []
    for cell, costs in cells:
        times = phase_times(costs, target).values()
        if sum(t.host_s for t in times) > sum(t.device_s for t in times):
            implied.append(cell.step_s / sum(t.calls for t in times) * 1e6)
    if not implied:
        raise ValueError(f"{path}: no host-bound step to derive a host time from")
    return float(np.median(implied))


def check(path: Path = DEFAULT, gpu: str | None = None, host_us: float | None = None,
          max_context: int = 512) -> pd.DataFrame:
    """One row per (size, context, precision, phase) of the table: predicted and measured
    seconds, their ratio, the prediction's bound ('host' / 'device') and, for a cell predicted
    too fast, the host time per op in microseconds that would make it exact (a host slower than
    the default; NaN for cells predicted too slow)."""
    gpu, cells = _cells(path, gpu, max_context)
    target = pr.gpu_targets(gpu, pr.HOST_OP_S if host_us is None else host_us * 1e-6)[0]
    rows = []
    for cell, costs in cells:
        times = phase_times(costs, target)
        for phase in PHASES:
            t, measured = times[phase], getattr(cell, f"{phase}_s")
            bound = "host" if t.host_s > t.device_s else "device"
            implied = np.nan
            if t.typical_s < measured:  # the host time per op at which this cell is exact
                lo, hi = 0.0, 1e-3
                for _ in range(40):
                    mid = (lo + hi) / 2
                    slower = phase_times(costs, pr.gpu_targets(gpu, mid)[0])[phase].typical_s
                    lo, hi = (mid, hi) if slower < measured else (lo, mid)
                implied = lo * 1e6
            rows.append({"size": cell.size, "context": cell.context,
                         "precision": cell.precision, "attention": cell.attention,
                         "phase": phase,
                         "predicted_s": t.typical_s, "measured_s": measured,
                         "ratio": t.typical_s / measured, "bound": bound, "calls": t.calls,
                         "implied_host_us": implied})
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--gpu", default=None, help="default: the table's, else A100-80GB")
    parser.add_argument("--host-us", default=None, help="microseconds, or 'records'")
    args = parser.parse_args()
    host_us = args.host_us
    if host_us == "records":
        host_us = derive_host_us(args.table, args.gpu)
        print(f"host time per op the table's host-bound steps imply: {host_us:.2f} us")
    df = check(args.table, args.gpu, None if host_us is None else float(host_us))
    print(df.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    big = df[df["size"] != "small"]
    print(f"\n{len(df)} cells: median |error| {(df['ratio'] - 1).abs().median():.1%}, ratio "
          f"{df['ratio'].min():.2f}..{df['ratio'].max():.2f}; medium and up "
          f"{big['ratio'].min():.2f}..{big['ratio'].max():.2f}")
    for precision, part in df.groupby("precision"):
        print(f"  {precision}: median |error| {(part['ratio'] - 1).abs().median():.1%}")
    implied = df["implied_host_us"].dropna()
    if len(implied):
        print("cells predicted too fast would be exact with a host of (us per op call, default "
              f"{pr.HOST_OP_S * 1e6:g}):")
        cells = df.dropna(subset=["implied_host_us"])
        print(cells[["size", "context", "phase", "implied_host_us"]].to_string(
            index=False, float_format=lambda v: f"{v:.1f}"))


if __name__ == "__main__":
    main()
