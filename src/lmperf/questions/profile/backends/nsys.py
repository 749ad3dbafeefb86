"""`lmperf profile --backend nsys`: the spec under Nsight Systems, tables from nsys's own reports.

The child (`lmperf.questions.profile.backends.nsys_child`) runs warm-up steps, then the measured steps inside the
NVTX range that nsys's capture range keys on, synchronising the device inside each phase range
so that a phase's kernels end within its range; `nsys stats` then exports the kernel summary of
each NVTX range (step, forward, loss, backward, optimizer). nsys sums over every measured step,
so calls and times are divided by the step count here. With the syncs inside the ranges, the
NVTX range table's durations include the phase's device work.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pandas as pd

from lmperf.workload.spec import RunSpec
from lmperf.workload.steps import PHASES
from lmperf.questions.profile.classify import classify
from lmperf.questions.profile.gemm import describe_gemm
from lmperf.questions.profile.backends.nsys_commands import run_nsys
from lmperf.questions.profile.backends.torch_profiler import ProfileResult


def profile_nsys(spec: RunSpec, output: Path, top: int = 10) -> ProfileResult:
    """Profile `spec` under nsys; raises LmperfError when nsys is missing or fails."""
    with tempfile.TemporaryDirectory(prefix="lmperf-nsys-") as tmp:
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec.to_dict()), encoding="utf-8")
        run = run_nsys([sys.executable, "-m", "lmperf.questions.profile.backends.nsys_child", str(spec_path)], output)
    result = ProfileResult(spec, "nsys", run.report)
    phases = PHASES[spec.mode] + ("step",)
    rollup = {}
    for phase in phases:
        df = run.kernels.get(phase, pd.DataFrame())
        if df.empty:
            result.notes.append(f"nsys reported no kernels inside the {phase!r} ranges.")
            continue
        df = df.copy()
        df["calls_per_step"] = df["calls"] / spec.steps
        df["ms_per_step"] = df["total_ms"] / spec.steps
        df["category"] = [classify(n) for n in df["name"]]
        df["gemm"] = [describe_gemm(n) or "" for n in df["name"]]
        rollup[phase] = df.groupby("category")["share"].sum()
        cols = ["name", "category", "calls_per_step", "ms_per_step", "avg_us", "share", "gemm"]
        result.tables.append((f"top kernels (nsys): {phase}", df[cols].head(top)))
    if rollup:
        pivot = pd.DataFrame(rollup).fillna(0.0).reset_index(names="category")
        result.tables.append(("share of each phase by category (nsys)", pivot))
    if not run.ranges.empty:
        result.tables.append(("NVTX ranges (nsys, all measured steps)", run.ranges))
    result.notes.append("Commands run: " + " | ".join(" ".join(c) for c in run.commands))
    return result
