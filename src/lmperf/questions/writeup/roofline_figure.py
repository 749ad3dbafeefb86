"""The roofline figure of profile records: operators as points sized by their measured time.

Drawn from what each record stored (`profile.roofline`'s per-op and ceilings tables), so `lmperf
report` redraws it from the results file alone. Two panels per profiled run:
- left, the classic roofline: arithmetic intensity (FLOP/byte) against attained GFLOP/s for the
  ops that do FLOPs (matmuls), under the roofs min(matmul ceiling, intensity x bandwidth) of the
  device's MEASURED ceilings, one roof per dtype;
- right, every op with a roofline time: measured ms against ideal ms (log-log). The diagonal is
  the roof (measured = ideal), the dotted line 10x above it the overhead-bound threshold; memory-
  bound ops with no FLOPs (softmax, norms, elementwise), which the left panel cannot place, are
  here.
"""

from __future__ import annotations

import math

import pandas as pd

from lmperf.questions.writeup.figures import _figure, png
from lmperf.questions.writeup.sections import run_labels

MAX_RUNS = 6  # panels pairs in one figure
COLORS = {"compute-bound": "tab:blue", "memory-bound": "tab:orange",
          "overhead-bound": "tab:red"}


def _tables(record: dict) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """(per-op rows, ceilings rows) of an ok profile record that has a roofline, else None."""
    from lmperf.results.record import stored_table
    from lmperf.questions.profile.roofline import CEILINGS, PER_OP

    tables = (record.get("metrics") or {}).get("tables") or {}
    if record.get("status") != "ok" or PER_OP not in tables or CEILINGS not in tables:
        return None
    ops = stored_table(PER_OP, tables[PER_OP])
    ops = ops[~ops["op"].astype(str).str.startswith("(")]  # the "(N other ops)" rows
    return ops, stored_table(CEILINGS, tables[CEILINGS])


def roofline_png(records: list[dict]) -> bytes | None:
    """PNG: the roofline of each profiled run (see the module docstring); None when no record
    has a roofline (older records, failed runs)."""
    runs = [(label, t) for r, label in zip(records, run_labels(records))
            if (t := _tables(r)) is not None][:MAX_RUNS]
    if not runs:
        return None
    fig = _figure(11.0, 4.4 * len(runs))
    axes = fig.subplots(len(runs), 2, squeeze=False)
    for (label, (ops, ceilings)), (left, right) in zip(runs, axes):
        _classic(left, ops, ceilings, label)
        _measured_vs_ideal(right, ops, label)
    return png(fig)


def _points(ax, pts: pd.DataFrame, x: str, y: str, biggest: float, named: int,
            offset) -> None:
    """`pts` at (x, y), coloured by bound, their marker areas proportional to measured time (an
    op of `biggest` ms gets 400 pt^2); the `named` slowest labelled, the i-th label `offset(i)`
    points away."""
    for bound, group in pts.groupby("bound"):
        sizes = [20 + 380 * (v / biggest) if biggest > 0 else 20 for v in group["measured_ms"]]
        ax.scatter(group[x], group[y], s=sizes, alpha=0.6, color=COLORS.get(bound, "gray"),
                   label=bound, edgecolors="black", lw=0.5)
    for i, r in enumerate(pts.nlargest(named, "measured_ms").itertuples()):
        ax.annotate(f"{r.phase[:3]} {r.op.removeprefix('aten::')}", (getattr(r, x), getattr(r, y)),
                    fontsize=7, xytext=offset(i), textcoords="offset points",
                    arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "gray"})


def _classic(ax, ops: pd.DataFrame, ceilings: pd.DataFrame, label: str) -> None:
    """Intensity vs attained GFLOP/s under the measured roofs."""
    bw = float(ceilings.loc[ceilings["ceiling"].str.startswith("bandwidth"), "attained"].max())
    roofs = ceilings[ceilings["ceiling"].str.startswith("matmul")]
    pts = ops[(ops["gflop"] > 0) & (ops["measured_ms"] > 0)]
    lo = min([0.1] + [float(v) for v in pts["intensity_flop_per_byte"] if v > 0]) / 2
    hi = max([100.0] + [float(v) for v in pts["intensity_flop_per_byte"]]) * 2
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    for r in roofs.itertuples():  # attained GFLOP/s; bandwidth in GB/s: I x BW is GFLOP/s
        ax.plot(xs, [min(r.attained, x * bw) for x in xs], lw=1.5,
                label=f"roof: {r.ceiling} {r.attained:.3g} GFLOP/s, {bw:.3g} GB/s")
    _points(ax, pts, "intensity_flop_per_byte", "attained_gflop_per_s",
            float(ops["measured_ms"].max()), 6, lambda i: (-60, -12 - 10 * i))
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity, FLOP/byte",
           ylabel="attained GFLOP/s", title=f"{label}: roofline (ops with FLOPs)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")


def _measured_vs_ideal(ax, ops: pd.DataFrame, label: str) -> None:
    """Measured vs ideal ms, every op with a roofline time; the roof and the 10x line."""
    from lmperf.questions.profile.roofline import OVERHEAD_RATIO

    biggest = float(ops["measured_ms"].max())
    # ops under 1e-4 of the largest (scalar bookkeeping) would stretch the axes by decades
    pts = ops[(ops["ideal_ms"] > 0) & (ops["measured_ms"] >= biggest * 1e-4)]
    _points(ax, pts, "ideal_ms", "measured_ms", biggest, 5, lambda i: (6, -10 * i))
    if len(pts):
        lo = float(min(pts["ideal_ms"].min(), pts["measured_ms"].min())) / 2
        hi = float(max(pts["ideal_ms"].max(), pts["measured_ms"].max())) * 2
        ax.plot([lo, hi], [lo, hi], color="black", lw=1, label="measured = ideal (the roof)")
        ax.plot([lo, hi], [lo * OVERHEAD_RATIO, hi * OVERHEAD_RATIO], color="black", lw=1,
                ls=":", label=f"{OVERHEAD_RATIO:g}x ideal: overhead-bound above")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi * OVERHEAD_RATIO if math.isfinite(hi) else None)
    ax.set(xscale="log", yscale="log", xlabel="ideal (roofline) ms per step",
           ylabel="measured ms per step", title=f"{label}: measured vs ideal, per op")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
