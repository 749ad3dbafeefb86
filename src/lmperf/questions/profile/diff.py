"""`lmperf profile --diff A B`: two traces compared operator by operator and kernel by kernel.

As HTA's `TraceDiff.compare_traces` (calls and total duration per name on each side, and what
changed), except that every count and time is per measured step (the mean over all of each
trace's steps, not HTA's first one), as two traces rarely hold the same number of steps.
Operators are cpu_ops with their inclusive duration (as HTA); kernels every device activity.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from lmperf.questions.profile.classify import classify, short_name
from lmperf.questions.profile.trace import Trace

DIFF_COLUMNS = ["name", "category", "status", "calls_a", "calls_b", "ms_a", "ms_b", "delta_ms",
                "mean_us_a", "mean_us_b", "mean_ratio"]


def _per_step(trace: Trace, kind: str) -> pd.DataFrame:
    """name -> calls and ms per measured step, mean_us per call (events of measured steps)."""
    df = trace.ops if kind == "ops" else trace.kernels
    if df.empty:
        return pd.DataFrame(columns=["calls", "ms", "mean_us"])
    df = df[df["step"].to_numpy() >= 0]
    n = max(trace.n_steps, 1)
    g = df.groupby("name", sort=False)["dur_us"].agg(["count", "sum"])
    return pd.DataFrame({"calls": g["count"] / n, "ms": g["sum"] / 1e3 / n,
                         "mean_us": g["sum"] / g["count"]})


def trace_diff(a: Trace, b: Trace, kind: str = "kernels") -> pd.DataFrame:
    """A vs B per name for `kind` "ops" or "kernels" (see the module): name, category
    (`classify`), status, calls_a / calls_b (per step), ms_a / ms_b (per step), delta_ms (B - A),
    mean_us_a / mean_us_b (per call), mean_ratio (B / A)."""
    pa, pb = _per_step(a, kind), _per_step(b, kind)
    out = pa.add_suffix("_a").join(pb.add_suffix("_b"), how="outer")
    in_a, in_b = out["calls_a"].notna().to_numpy(), out["calls_b"].notna().to_numpy()
    for col in ("calls_a", "calls_b", "ms_a", "ms_b"):
        out[col] = out[col].fillna(0.0)
    out["delta_ms"] = out["ms_b"] - out["ms_a"]
    out["mean_ratio"] = out["mean_us_b"] / out["mean_us_a"]
    calls_a, calls_b = out["calls_a"].to_numpy(), out["calls_b"].to_numpy()
    out["status"] = np.select(
        [~in_a, ~in_b, np.isclose(calls_a, calls_b, rtol=1e-9, atol=1e-9), calls_b > calls_a],
        ["new", "vanished", "=", "more"], "fewer")
    out = out.rename_axis("name").reset_index()
    out["name"] = out["name"].astype(object)
    out["category"] = out["name"].map(classify)
    out = out.assign(_abs=out["delta_ms"].abs()).sort_values(
        ["_abs", "name"], ascending=[False, True], kind="stable")
    return out.reset_index(drop=True)[DIFF_COLUMNS]


def summary(diff: pd.DataFrame) -> dict[str, float]:
    """Counts of names by status and the per-step totals of A and B (ms) of one diff table."""
    counts = diff["status"].value_counts()
    return {"names": len(diff), **{s: int(counts.get(s, 0)) for s in ("new", "vanished", "more",
                                                                       "fewer", "=")},
            "ms_a": float(diff["ms_a"].sum()), "ms_b": float(diff["ms_b"].sum())}


def diff_report(path_a: str | Path, path_b: str | Path, top: int = 10) -> "Report":
    """The Report of `lmperf profile --diff A B`: frame = per-step totals of each side; tables =
    the `top` operators and kernels whose time per step changed most, and every new and vanished
    name (up to `top` each); findings in one line each. Raises TraceFormatError for a missing or
    bad file, SpecError for `top` < 1."""
    from lmperf.core.report import Report
    from lmperf.errors import SpecError, TraceFormatError
    from lmperf.questions.profile.from_trace import as_one_step
    from lmperf.questions.profile.report import KIND
    from lmperf.questions.profile.trace import load_trace

    if top < 1:
        raise SpecError(f"--top must be a positive integer, got {top}")
    traces = []
    for path in (Path(path_a), Path(path_b)):
        if not path.is_file():
            raise TraceFormatError(f"no trace file at {path}")
        trace = load_trace(path)
        traces.append(as_one_step(trace) if trace.n_steps == 0 else trace)
    a, b = traces
    tables: dict[str, pd.DataFrame] = {}
    rows, findings = [], []
    for kind, noun in (("ops", "operators"), ("kernels", "kernels")):
        d = trace_diff(a, b, kind)
        if d.empty:
            continue
        s = summary(d)
        rows.append({"what": noun, "names": s["names"], "ms_per_step_a": s["ms_a"],
                     "ms_per_step_b": s["ms_b"], "new": s["new"], "vanished": s["vanished"],
                     "more": s["more"], "fewer": s["fewer"], "same_calls": s["="]})
        shown = d.assign(name=[short_name(n) for n in d["name"]])
        tables[f"{noun}: largest changes of time per step (B - A)"] = shown.head(top)
        for status in ("new", "vanished"):
            part = shown[shown["status"] == status]
            if len(part):
                tables[f"{noun}: {status} in B ({len(part)} names)"] = part.head(top)
        findings.append(
            f"{noun.capitalize()}: {s['names']} names, {s['new']} new and {s['vanished']} "
            f"vanished in B, {s['more']} called more and {s['fewer']} fewer times per step; "
            f"{s['ms_a']:.2f} -> {s['ms_b']:.2f} ms per step summed over names"
            + (" (operators nest: their inclusive times add up past the step)" if kind == "ops"
               else "") + ".")
    findings.append(f"A: {Path(path_a).name}, {a.n_steps} step(s); B: {Path(path_b).name}, "
                    f"{b.n_steps} step(s); calls and times are per measured step.")
    return Report(kind=KIND, frame=pd.DataFrame(rows), tables=tables, findings=findings,
                  records=[], title=f"lmperf profile --diff {Path(path_a).name} {Path(path_b).name}")
