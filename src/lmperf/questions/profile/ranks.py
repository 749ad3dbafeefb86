"""`lmperf profile --from-trace DIR`: one torch.profiler trace per rank, read side by side.

The files are read one at a time (only each rank's tables stay in memory); a file's rank is its
`distributedInfo.rank`, else a `rank<N>` in its name. Steps are matched across ranks by their
index among each rank's measured steps. The tables (per rank and step, per rank and phase, the
slowest rank and the straggler per step, HTA's whole-window breakdown per rank):
docs/commands/profile.md, "Many ranks".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from lmperf.errors import TraceFormatError
from lmperf.questions.profile import overlap
from lmperf.questions.profile.trace import Trace, load_trace

_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
TRACE_SUFFIXES = (".json", ".json.gz")


@dataclass
class RankTables:
    """What is kept of one rank's trace: its per-step and whole-window breakdowns."""

    rank: int
    path: Path
    steps: pd.DataFrame  # step, profiler_step, cpu_ms, then overlap.BREAKDOWN_COLUMNS
    whole: pd.DataFrame  # one row: overlap.breakdown(whole=True)
    n_steps: int
    world_size: int | None
    phases: pd.DataFrame | None = None  # from_trace.phase_times: ms per step per phase


def trace_files(directory: str | Path) -> list[Path]:
    """The trace files of `directory` (*.json, *.json.gz), sorted by name; TraceFormatError when
    there are none."""
    directory = Path(directory)
    files = sorted(p for p in directory.iterdir()
                   if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
    if not files:
        raise TraceFormatError(f"no trace files (*.json, *.json.gz) in {directory}")
    return files


def rank_of(trace: Trace, path: Path) -> int | None:
    """The rank of a trace: distributedInfo.rank, else a rank<N> in the file name, else None."""
    rank = trace.distributed.get("rank")
    if isinstance(rank, int) and not isinstance(rank, bool):
        return rank
    m = _RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m else None


def rank_tables(trace: Trace, rank: int, path: Path) -> RankTables:
    """The per-step table of one rank (host step time beside the device breakdown)."""
    from lmperf.questions.profile.from_trace import as_one_step, phase_times, present_phases, step_table

    if trace.n_steps == 0:
        trace = as_one_step(trace)
    phases = phase_times(trace, present_phases(trace))
    host = step_table(trace)[["step", "profiler_step", "cpu_ms"]]
    dev = overlap.breakdown(trace).drop(columns="phase")
    steps = host.merge(dev, on="step", how="left") if not dev.empty else host
    world = trace.distributed.get("world_size")
    return RankTables(rank=rank, path=path, steps=steps, whole=overlap.breakdown(trace, whole=True),
                      n_steps=trace.n_steps, world_size=world if isinstance(world, int) else None,
                      phases=phases)


def read_ranks(directory: str | Path) -> list[RankTables]:
    """Every rank's tables, sorted by rank; files with no rank get the ranks after the others'
    (in name order). One trace is in memory at a time. Raises TraceFormatError for
    two files of one rank or a bad file."""
    found: list[RankTables] = []
    for path in trace_files(directory):
        trace = load_trace(path)
        rank = rank_of(trace, path)
        clash = next((r for r in found if rank is not None and r.rank == rank), None)
        if clash is not None:
            raise TraceFormatError(f"{clash.path.name} and {path.name} are both rank {rank}: "
                                   "one trace per rank in --from-trace DIR")
        found.append(rank_tables(trace, -1 if rank is None else rank, path))
        del trace
    unnamed = [r for r in found if r.rank < 0]  # in name order
    next_rank = max((r.rank for r in found), default=-1) + 1
    for i, r in enumerate(unnamed):
        r.rank = next_rank + i
    return sorted(found, key=lambda r: r.rank)


def per_rank_step(ranks: list[RankTables]) -> pd.DataFrame:
    """One row per (rank, step): rank, step, profiler_step, cpu_ms and the device breakdown."""
    return pd.concat([r.steps.assign(rank=r.rank) for r in ranks], ignore_index=True)[
        ["rank", *ranks[0].steps.columns]] if ranks else pd.DataFrame()


def stragglers(table: pd.DataFrame) -> pd.DataFrame:
    """Per step seen on every rank (steps some rank lacks are left out): ranks, slowest_rank and its step_ms (the device span on a GPU
    trace, else the host step time), fastest_ms, spread (max/min - 1, a fraction), and on a GPU
    trace straggler (the rank with the most computation), its compute_ms and the others' mean
    compute_ms."""
    time_col = "span_ms" if "span_ms" in table and table["span_ms"].notna().any() else "cpu_ms"
    rows = []
    n_ranks = table["rank"].nunique()
    for step, g in table.groupby("step", sort=True):
        g = g.dropna(subset=[time_col])
        if len(g) < n_ranks:
            continue
        slow = g.loc[g[time_col].idxmax()]
        row = {"step": int(step), "ranks": len(g), "slowest_rank": int(slow["rank"]),
               "step_ms": float(slow[time_col]), "fastest_ms": float(g[time_col].min()),
               "spread": float(slow[time_col] / g[time_col].min() - 1)}
        if "compute_ms" in g and g["compute_ms"].notna().any():
            s = g.loc[g["compute_ms"].idxmax()]
            rest = g[g["rank"] != s["rank"]]["compute_ms"]
            row |= {"straggler": int(s["rank"]), "straggler_compute_ms": float(s["compute_ms"]),
                    "others_compute_ms": float(rest.mean()) if len(rest) else np.nan}
        rows.append(row)
    return pd.DataFrame(rows)


def rank_summary(ranks: list[RankTables]) -> pd.DataFrame:
    """One row per rank: steps, mean step times, and HTA's whole-window breakdown: span_ms,
    idle / host-wait / compute / non_compute shares, comm_hidden_share, and the rank's bound
    (`overlap.bound`)."""
    rows = []
    for r in ranks:
        row = {"rank": r.rank, "file": r.path.name, "steps": r.n_steps,
               "cpu_step_ms": float(r.steps["cpu_ms"].mean())}
        if not r.whole.empty:
            w = r.whole.iloc[0]
            row |= {"gpu_step_ms": float(r.steps["span_ms"].mean()),
                    "compute_ms_per_step": float(r.steps["compute_ms"].mean()),
                    "comm_ms_per_step": float(r.steps["comm_ms"].mean()),
                    "exposed_comm_ms_per_step": float(r.steps["exposed_comm_ms"].mean()),
                    "idle_ms_per_step": float(r.steps["idle_ms"].mean()),
                    **{c: float(w[c]) for c in ("span_ms", "idle_share", "host_wait_share",
                                                "compute_share", "non_compute_share",
                                                "comm_hidden_share")},
                    "bound": overlap.bound(w["idle_share"], w["host_wait_share"])}
        rows.append(row)
    return pd.DataFrame(rows)


RANK_STEP_TABLE = "per rank and step (ms; shares of the device span, 0..1)"
STRAGGLER_TABLE = "per step: slowest rank and straggler"
RANK_PHASE_TABLE = "per rank and phase (ms per step, mean over the rank's steps)"


def analyse_ranks(directory: str | Path) -> "Report":
    """The Report of a directory of per-rank traces (see the module): frame = per rank summary;
    tables = per rank and step, stragglers per step, per rank and phase. Raises
    TraceFormatError for an empty directory, a bad file or two files of one rank."""
    from lmperf.core.report import Report
    from lmperf.questions.profile.report import KIND

    directory = Path(directory)
    found = read_ranks(directory)
    table = per_rank_step(found)
    tables = {RANK_STEP_TABLE: table, STRAGGLER_TABLE: stragglers(table),
              RANK_PHASE_TABLE: pd.concat([r.phases.assign(rank=r.rank) for r in found],
                                          ignore_index=True).pipe(
                  lambda df: df[["rank", *[c for c in df.columns if c != "rank"]]])}
    summary = rank_summary(found)
    findings = _findings(found, summary, tables[STRAGGLER_TABLE])
    return Report(kind=KIND, frame=summary, tables=tables, findings=findings, records=[],
                  title=f"lmperf profile --from-trace {directory.name}/ ({len(found)} ranks)")


def _findings(ranks: list[RankTables], summary: pd.DataFrame, strag: pd.DataFrame) -> list[str]:
    out = []
    worlds = {r.world_size for r in ranks if r.world_size}
    if worlds and max(worlds) > len(ranks):
        out.append(f"{len(ranks)} of {max(worlds)} ranks' traces are in the directory: the "
                   "straggler is the slowest of these.")
    steps = {r.n_steps for r in ranks}
    if len(steps) > 1:
        out.append(f"The ranks hold different numbers of measured steps ({sorted(steps)}): "
                   "steps are matched by index, and steps some rank lacks are in no straggler row.")
    if not strag.empty and "straggler" in strag:
        top = strag["straggler"].value_counts()
        rank, n = int(top.index[0]), int(top.iloc[0])
        out.append(f"Rank {rank} computes longest in {n} of {len(strag)} steps (mean "
                   f"{strag['straggler_compute_ms'].mean():.2f} ms vs {strag['others_compute_ms'].mean():.2f} "
                   "ms on the others): the others wait for it inside their collectives, so their "
                   "communication time includes that wait.")
    if "comm_hidden_share" in summary:
        for row in summary.itertuples():
            comm = (f"{row.comm_ms_per_step:.2f} ms of communication per step, "
                    f"{row.comm_hidden_share:.0%} of it under computation, "
                    f"{row.exposed_comm_ms_per_step:.2f} ms exposed; " if row.comm_ms_per_step > 0
                    else "")
            out.append(f"Rank {row.rank}: {comm}GPU idle {row.idle_share:.0%} of its span, "
                       f"{row.host_wait_share:.0%} waiting for the host's launches: "
                       f"{row.bound} (HTA's breakdowns, `overlap`).")
    return out
