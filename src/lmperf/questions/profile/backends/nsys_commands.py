"""The Nsight Systems backend: build the `nsys profile` / `nsys stats` command lines, run them, and
parse the CSV exports of the `cuda_gpu_kern_sum` and `nvtx_sum` reports into DataFrames.

Only `run_nsys` needs `nsys` on PATH; everything else is pure and tested on the CPU.

Collection (`nsys profile`, Nsight Systems User Guide, "CLI Profile Command Switch Options"):
`--trace=cuda,nvtx` collects CUDA API/kernels and NVTX ranges; `--capture-range=nvtx` with
`--nvtx-capture=<range>` starts collecting when the NVTX range `MEASURED_RANGE` opens, and
`--capture-range-end=stop` stops at its end, so the warm-up steps are never recorded. A range name
given without `@domain` is looked up in the default domain, which is where `torch.cuda.nvtx.range`
pushes. Nsight matches capture ranges only against registered NVTX strings by default;
`torch.cuda.nvtx` pushes plain (unregistered) strings, hence `NSYS_NVTX_PROFILER_REGISTER_ONLY=0`,
passed with `--env-var` and set in the child's environment. The child must synchronize the device
before it closes `MEASURED_RANGE`, or kernels still in flight at the end of the range are lost.

Reports (`nsys stats --report <name> --format csv --output -`, Post-Collection Analysis Guide;
column names from the report scripts shipped in `<nsys>/host-linux-x64/reports/`):
- `cuda_gpu_kern_sum` (2022.x and later): `Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),
  Min (ns),Max (ns),StdDev (ns),Name`. Nsight 2020.x-2021.x named it `gpukernsum` with
  `Time(%),Total Time (ns),Instances,Average,Minimum,Maximum,Name`; both are read. `Time (%)` is a
  share of the listed kernels' summed time, rounded to 0.1; `share` here is recomputed unrounded.
- `nvtx_sum`: `Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),
  Style,Range`; default-domain ranges print as `:name` (older `nvtxppsum`: `Time(%),Total Time (ns),
  Instances,Average,Minimum,Maximum,Range`). These are host-side range durations (CPU push to
  pop), not GPU time.
`--filter-nvtx=<range>[@<domain>][/<index>]` restricts a report to the events inside a range; with
no index every instance of the range counts (so a `forward` filter over N measured steps sums N
forward passes). It filters "using only the start and end times of the matching ranges" (the
option's text in Nsight's recipe definitions; `--filter-projected-nvtx` is the GPU-projected
variant recipes have and `nsys stats` has not): NVTX ranges are CPU push-to-pop times, so a
kernel still running when the CPU pops `forward` falls out of `forward`. The child therefore
synchronises the device inside each phase range (`nsys_child.synced_annotate`), which makes the
range's time window hold all of its kernels. A filter naming a range that does not exist prints
no table and exits 0; the parsers then return an empty DataFrame.

Report names changed in Nsight Systems 2022.x (`gpukernsum` -> `cuda_gpu_kern_sum`, `nvtxppsum`
/ `nvtxsum` -> `nvtx_sum`): `run_nsys` asks `nsys stats --help-reports` which ones the installed
version has. `nsys stats` exports the report to SQLite beside it and reuses that file on later
calls; a `.sqlite` older than a re-profiled `.nsys-rep` makes it stop ("File is older than input
file"), so the first stats call passes `--force-export=true` (the later ones reuse the fresh
export instead of re-exporting each time).
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import pandas as pd

from lmperf.errors import LmperfError
from lmperf.questions.profile.annotate import BACKWARD, FORWARD, LOSS, OPTIMIZER, STEP

MEASURED_RANGE = "measured"
KERN_SUM, NVTX_SUM = "cuda_gpu_kern_sum", "nvtx_sum"
# Each report's names, newest first (Nsight Systems 2022.x and later, then 2020.x-2021.x).
KERN_SUM_NAMES: tuple[str, ...] = (KERN_SUM, "gpukernsum")
NVTX_SUM_NAMES: tuple[str, ...] = (NVTX_SUM, "nvtxsum", "nvtxppsum")
NVTX_ENV = "NSYS_NVTX_PROFILER_REGISTER_ONLY"
NO_NSYS = "nsys is not on PATH; use --backend torch"

KERNEL_COLUMNS = ["name", "calls", "total_ms", "avg_us", "med_us", "min_us", "max_us", "stddev_us",
                  "share"]
RANGE_COLUMNS = ["range", "style", "instances", "total_ms", "avg_us", "med_us", "min_us", "max_us",
                 "stddev_us", "share", "raw_range"]

_TO_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9, "sec": 1e9}
_HEADER = re.compile(r'^\s*"?Time ?\(%\)"?\s*,')
# Stat column names of both header generations -> our column stem.
_STATS = {
    "total time": "total", "avg": "avg", "average": "avg", "med": "med", "min": "min",
    "minimum": "min", "max": "max", "maximum": "max", "stddev": "stddev",
}
_UNIT_HEADER = re.compile(r"^(?P<stat>[A-Za-z ]+?)\s*(?:\((?P<unit>ns|us|ms|sec|s)\))?$")


def nsys_path() -> str | None:
    """The `nsys` executable on PATH, or None."""
    return shutil.which("nsys")


def report_path(output: Path) -> Path:
    """Where `nsys profile --output=<output>` writes its report: `.nsys-rep` is appended unless
    the name already ends with it."""
    output = Path(output)
    return output if output.suffix == ".nsys-rep" else output.with_name(output.name + ".nsys-rep")


def build_profile_command(nsys: str, output: Path, child_argv: list[str],
                          capture_range: str = MEASURED_RANGE) -> list[str]:
    """`nsys profile` argv that records CUDA + NVTX inside the NVTX range `capture_range` only and
    then runs `child_argv` (the child process that opens that range around the measured steps)."""
    return [
        nsys, "profile",
        "--trace=cuda,nvtx",
        "--capture-range=nvtx",
        f"--nvtx-capture={capture_range}",
        "--capture-range-end=stop",
        f"--env-var={NVTX_ENV}=0",
        "--sample=none",      # no CPU sampling or context-switch tracing: less overhead, the
        "--cpuctxsw=none",    # tables here use CUDA and NVTX data only
        "--force-overwrite=true",
        f"--output={output}",
        *child_argv,
    ]


def nvtx_filter(range_name: str, domain: str | None = None, index: int | None = None) -> str:
    """The `--filter-nvtx` value `range[@domain][/index]` (index counts instances from 0)."""
    value = range_name + (f"@{domain}" if domain else "")
    return value + (f"/{index}" if index is not None else "")


def build_stats_command(nsys: str, report_path: Path, report: str = KERN_SUM,
                        nvtx_filter: str | None = None, force_export: bool = False) -> list[str]:
    """`nsys stats` argv printing the report named `report` of the file `report_path` as CSV on
    stdout, optionally restricted to an NVTX range (a value built by the function `nvtx_filter`);
    `force_export` re-exports the report's SQLite file even if one exists (`--force-export=true`)."""
    argv = [nsys, "stats", f"--report={report}", "--format=csv", "--output=-"]
    if force_export:
        argv.append("--force-export=true")
    if nvtx_filter:
        argv.append(f"--filter-nvtx={nvtx_filter}")
    return argv + [str(report_path)]


def build_help_reports_command(nsys: str) -> list[str]:
    """`nsys stats --help-reports` argv: lists the reports the installed version has."""
    return [nsys, "stats", "--help-reports"]


_WORD = re.compile(r"[a-z][a-z0-9_]*")


def report_names(help_text: str) -> set[str]:
    """The lower-case words of `nsys stats --help-reports` output, among them every report name
    ("  cuda_gpu_kern_sum[:nvtx-name][:base|:mangled] -- CUDA GPU Kernel Summary", one per line
    or several on a line, depending on the version): only membership of known names is asked."""
    return set(_WORD.findall(help_text))


def _help_reports(argv: list[str], timeout_s: float | None) -> str:
    """stdout + stderr of `nsys stats --help-reports`, whatever its exit status (some versions
    list the reports and exit 1); empty when it cannot run."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout + proc.stderr


def pick_report(available: set[str], names: Sequence[str]) -> str:
    """The first of `names` (newest first) the installed nsys has; the newest when the list of
    available reports could not be read."""
    return next((n for n in names if n in available), names[0])


def _table_rows(text: str) -> list[list[str]] | None:
    """The CSV rows of the first report table in `text` (header first), skipping whatever nsys
    prints before it ("Processing [...] with [...]..."); None when there is no table."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _HEADER.match(line)), None)
    if start is None:
        if "Total Time" in text:
            first = text.strip().splitlines()[0][:120]
            raise LmperfError(f"unrecognised nsys stats header in: {first!r}")
        return None
    body = []
    for line in lines[start:]:
        if not line.strip():
            break  # a blank line ends the table
        body.append(line)
    return list(csv.reader(io.StringIO("\n".join(body))))


def _number(cell: str) -> float:
    cell = cell.strip().replace(",", "")
    return float(cell) if cell else math.nan


def _columns(header: list[str]) -> dict[str, tuple[int, float]]:
    """Map our stat stems (total, avg, ...) to (column index, nanoseconds per header unit)."""
    found: dict[str, tuple[int, float]] = {}
    for i, cell in enumerate(header):
        m = _UNIT_HEADER.match(cell.strip())
        if not m:
            continue
        stem = _STATS.get(m.group("stat").lower())
        if stem and stem not in found:
            found[stem] = (i, _TO_NS[m.group("unit") or "ns"])  # unit-less old headers are ns
    return found


def _stat_frame(rows: list[list[str]], label: str) -> pd.DataFrame:
    """Shared part of both parsers: count, times (ms / us) and unrounded share per row."""
    header = [c.strip() for c in rows[0]]
    cols = _columns(header)
    try:
        label_at = header.index(label)
        count_at = header.index("Instances")
        total_at, total_scale = cols["total"]
    except (ValueError, KeyError):
        raise LmperfError(
            f"nsys stats table lacks {label!r}, 'Instances' or 'Total Time': {header}") from None
    data: dict[str, list] = {"label": [], "count": [], "total_ms": []}
    for stem in ("avg", "med", "min", "max", "stddev"):
        data[f"{stem}_us"] = []
    for row in rows[1:]:
        if len(row) < len(header):
            continue
        data["label"].append(row[label_at])
        data["count"].append(int(_number(row[count_at])))
        data["total_ms"].append(_number(row[total_at]) * total_scale / 1e6)
        for stem in ("avg", "med", "min", "max", "stddev"):
            at = cols.get(stem)
            data[f"{stem}_us"].append(_number(row[at[0]]) * at[1] / 1e3 if at else math.nan)
    frame = pd.DataFrame(data)
    total = frame["total_ms"].sum()
    frame["share"] = frame["total_ms"] / total if total > 0 else 0.0
    return frame


def parse_kern_sum_csv(text: str) -> pd.DataFrame:
    """The `cuda_gpu_kern_sum` (or older `gpukernsum`) CSV as a DataFrame with `KERNEL_COLUMNS`:
    kernel name, calls (instances), total_ms, avg/med/min/max/stddev in microseconds (NaN where the
    report version has no such column) and share of the table's summed kernel time (0..1).
    Empty (with those columns) when `text` holds no table."""
    rows = _table_rows(text)
    if not rows:
        return pd.DataFrame(columns=KERNEL_COLUMNS)
    frame = _stat_frame(rows, "Name").rename(columns={"label": "name", "count": "calls"})
    return frame[KERNEL_COLUMNS]


def parse_nvtx_sum_csv(text: str) -> pd.DataFrame:
    """The `nvtx_sum` (or older `nvtxppsum`) CSV as a DataFrame with `RANGE_COLUMNS`: range name
    (the default domain's leading ':' removed; `raw_range` keeps the printed name), style
    (PushPop / StartEnd, None in old versions), instances, host-side total_ms, avg/med/min/max/
    stddev in microseconds, and share of the summed range time. Empty when `text` holds no table."""
    rows = _table_rows(text)
    if not rows:
        return pd.DataFrame(columns=RANGE_COLUMNS)
    header = [c.strip() for c in rows[0]]
    frame = _stat_frame(rows, "Range").rename(columns={"label": "raw_range", "count": "instances"})
    frame["range"] = [r[1:] if r.startswith(":") else r for r in frame["raw_range"]]
    if "Style" in header:
        at = header.index("Style")
        frame["style"] = [row[at] for row in rows[1:] if len(row) >= len(header)]
    else:
        frame["style"] = None
    return frame[RANGE_COLUMNS]


@dataclass
class NsysRun:
    """What `run_nsys` produced: the report file, the kernel table of the whole capture ("all")
    and of each filtered range, the NVTX range table, and the commands that were run."""

    report: Path
    kernels: dict[str, pd.DataFrame]
    ranges: pd.DataFrame
    commands: list[list[str]] = field(default_factory=list)


def _run(argv: list[str], env: dict[str, str] | None, timeout_s: float | None) -> str:
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise LmperfError(f"{' '.join(argv[:2])} did not finish within {timeout_s:g} s") from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise LmperfError(f"{' '.join(argv[:2])} failed with exit code {proc.returncode}: {tail[0]}")
    return proc.stdout


def run_nsys(child_argv: list[str], output: Path,
             filters: Sequence[str] = (STEP, FORWARD, LOSS, BACKWARD, OPTIMIZER),
             nsys: str | None = None, timeout_s: float | None = None) -> NsysRun:
    """Profile `child_argv` under `nsys profile` (capture = `MEASURED_RANGE`), then export the
    kernel summary of the whole capture (re-exporting the report's SQLite file) and of each
    NVTX range in `filters`, and the NVTX range summary, under the report names the installed
    nsys has. Raises LmperfError when nsys is missing, fails, or writes no report."""
    nsys = nsys or nsys_path()
    if nsys is None:
        raise LmperfError(NO_NSYS)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, NVTX_ENV: "0"}
    commands = [build_profile_command(nsys, output, child_argv)]
    _run(commands[0], env, timeout_s)
    report = report_path(output)
    if not report.exists():
        raise LmperfError(
            f"nsys wrote no report at {report}: the child never opened the NVTX range "
            f"{MEASURED_RANGE!r}, or NVTX is unavailable in its torch build")
    commands.append(build_help_reports_command(nsys))
    available = report_names(_help_reports(commands[-1], timeout_s))
    kern_sum, nvtx_sum = pick_report(available, KERN_SUM_NAMES), pick_report(available, NVTX_SUM_NAMES)
    kernels: dict[str, pd.DataFrame] = {}
    for name in ("all", *filters):
        argv = build_stats_command(nsys, report, kern_sum,
                                   None if name == "all" else nvtx_filter(name),
                                   force_export=name == "all")  # the first export refreshes
        commands.append(argv)
        kernels[name] = parse_kern_sum_csv(_run(argv, None, timeout_s))
    argv = build_stats_command(nsys, report, nvtx_sum)
    commands.append(argv)
    ranges = parse_nvtx_sum_csv(_run(argv, None, timeout_s))
    return NsysRun(report=report, kernels=kernels, ranges=ranges, commands=commands)
