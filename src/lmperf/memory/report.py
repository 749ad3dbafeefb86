"""`lmperf memory`'s tables, findings, records and plot, built from the measurements' results."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from lmperf.workload.spec import RunSpec
from lmperf.memory.checkpointing import CheckpointRow, tradeoff_frame
from lmperf.memory.estimate import GIB, MIB, MemoryEstimate, fits
from lmperf.memory.phases import MEMORY_LABELS, PhaseRow, phase_frame, two_numbers
from lmperf.memory.saved import SavedReport
from lmperf.results.schema import make_record, to_jsonable
from lmperf.results.tables import render_sections
from lmperf.runtime import device as dev
from lmperf.runtime import env as envmod

KIND = "memory"
Tables = list[tuple[str, pd.DataFrame]]
FORMATS: tuple[str, ...] = ("text", "markdown", "latex")


def _cell(column: str, v: object) -> object:
    """A float as text: shares and errors as percentages, large values with separators."""
    if not isinstance(v, float):
        return "-" if v is None else v
    if v != v:  # NaN
        return "-"
    if column in ("share", "error"):
        return f"{v:+.2%}" if column == "error" else f"{v:.1%}"
    return f"{v:,.0f}" if abs(v) >= 1000 else ("0" if v == 0 else f"{v:.4g}")


def _display(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    for col in out.columns:
        if out[col].dtype.kind in "fO":
            out[col] = [_cell(col, v) for v in out[col]]
    return out


def render(tables: Tables, notes: list[str], fmt: str = "text") -> str:
    """Titled tables then findings, as text, Markdown or LaTeX."""
    tables = [(title, _display(df)) for title, df in tables]
    if fmt != "latex":
        return render_sections(tables, notes, fmt)
    parts = [df.to_latex(index=False, escape=True, caption=title) for title, df in tables]
    return "\n".join(parts) + "".join(f"% {n}\n" for n in notes)


def phases_section(rows: list[PhaseRow], estimates: dict[tuple[str, int, str], MemoryEstimate],
                   baseline_mib: float | None) -> tuple[Tables, list[str]]:
    """The two-numbers table, the per-phase table, and measured vs estimated step memory."""
    table = two_numbers(rows)
    label = table.attrs.get("label", "peak MiB")
    cpu = label == MEMORY_LABELS["cpu_process_peak_rss"]
    tables = [(f"peak memory per step ({label})", table),
              ("peak memory per phase (MiB)", phase_frame(rows))]
    compare = []
    for r in rows:
        est = estimates.get((r.precision, r.context, r.mode))
        key = "rss" if cpu else "allocated"
        start, peak = r.start.get(key), r.peak()
        if r.status != "ok" or est is None or start is None or peak is None:
            continue
        compare.append({"precision": r.precision, "context": r.context, "mode": r.mode,
                        "start MiB": start, "peak MiB": peak, "peak - start MiB": peak - start,
                        "estimate MiB": est.step_bytes / MIB,
                        "estimate / measured": est.step_bytes / MIB / (peak - start)
                        if peak > start else None})
    if compare:
        tables.append(("what a step adds: measured (peak - start) vs estimate (gradients, saved, "
                       "recompute, transient allowance)", pd.DataFrame(compare)))
    notes = [f"{label}: the largest per-phase peak of one step; a step starts holding the "
             "parameters (and AdamW's state after the warm-up step)"]
    if cpu:
        notes.append("CPU figures are this process's peak resident set (VmHWM, reset per phase, "
                     "freed memory returned to the OS at each phase boundary): process-level "
                     "memory including Python and torch"
                     + (f" ({baseline_mib:,.0f} MiB before the model was built)" if baseline_mib
                        else "") + ", not GPU memory")
    low = [c for c in compare if c["mode"] == "forward" and (c["estimate / measured"] or 1) < 0.8]
    if cpu and low:
        notes.append("a forward-only step's RSS grows past its live tensors (freed blocks are "
                     "returned to the OS only at phase boundaries, matmul workspaces): the "
                     "estimate counts tensors (logits and log-probabilities, or naive attention's "
                     "T x T working set), so it reads low against RSS there")
    notes += [f"{r.precision} {r.mode} at context {r.context}: {r.status} ({r.message})"
              for r in rows if r.status != "ok"]
    return tables, notes


def saved_section(reports: dict[tuple[str, int], SavedReport],
                  estimates: dict[tuple[str, int], MemoryEstimate | None],
                  top: int) -> tuple[Tables, list[str]]:
    """Saved-for-backward: one summary row per (precision, context); per group and top
    contributors for the longest context of the first precision."""
    rows = []
    for (precision, t), rep in reports.items():
        est = estimates.get((precision, t))
        measured = rep.total() + rep.total("weight copy")
        blocks = rep.block_bytes()
        first = next(iter(blocks.values()), 0)
        rows.append({
            "precision": precision, "context": t, "measured on": rep.device,
            "activations MiB": rep.total() / MIB,
            "weight copies MiB": rep.total("weight copy") / MIB,
            "estimate MiB": est.saved_bytes / MIB if est else None,
            "error": (est.saved_bytes - measured) / measured if est and measured else None,
            "residual MiB": rep.residual_bytes / MIB, "per block MiB": first / MIB,
            "block x residual": first / rep.residual_bytes if rep.residual_bytes else None,
        })
    summary = pd.DataFrame(rows)
    (precision, t), rep = max(reports.items(), key=lambda kv: (kv[0][0] == rows[0]["precision"],
                                                                kv[0][1]))
    blocks = rep.block_bytes()
    notes = []
    if blocks and rep.residual_bytes:
        name, b = next(iter(blocks.items()))
        notes.append(f"at context {t} ({precision}) block {name} saves {b / MIB:,.1f} MiB, "
                     f"{b / rep.residual_bytes:.1f}x the residual stream (B x T x d_model = "
                     f"{rep.residual_bytes / MIB:,.2f} MiB); all {len(blocks)} blocks: "
                     f"{sum(blocks.values()) / max(rep.total(), 1):.0%} of the activations")
    quadratic = rep.frame()
    if not quadratic.empty:
        sq = quadratic[(quadratic["kind"] == "activation")
                       & quadratic["shape"].map(lambda s: len(s) >= 2 and s[-1] == s[-2] == t)]
        if rep.total() and len(sq):
            notes.append(f"T x T tensors (scores, probabilities, mask) are "
                         f"{sq['bytes'].sum() / rep.total():.0%} of the activations at context {t}")
    notes.append("bytes are storage bytes, each storage counted once; parameters, RoPE buffers "
                 "and token ids that autograd saves are listed but not counted")
    return [("saved for backward (activations + autocast weight copies)", summary),
            (f"saved for backward per group: {precision}, context {t}", rep.by_group()),
            (f"largest saved activations: {precision}, context {t}", rep.top(top))], notes


def estimate_section(ests: list[MemoryEstimate], gib: float | None) -> tuple[Tables, list[str]]:
    """One breakdown per estimate; with `gib`, whether each fits."""
    tables, notes = [], []
    for e in ests:
        groups = f", checkpoint groups of {e.checkpoint_group}" if e.checkpoint_group else ""
        tables.append((f"estimate ({e.device}): {e.mode}, {e.regime}, {e.attention}, "
                       f"batch {e.batch}, context {e.context}{groups}", e.table()))
        if gib is not None:
            verdict = "yes" if fits(e, gib) else "no"
            notes.append(f"context {e.context}, {e.regime}: {e.total_bytes / GIB:.2f} GiB "
                         f"estimated -> fits in {gib:g} GiB: {verdict}")
    notes.append("the total adds every term (gradients and activations never peak together): "
                 "an upper bound on the tensors; parameters, gradients and AdamW state are exact. "
                 "Leave room for the runtime: the CUDA context, or Python + torch on a CPU")
    return tables, notes


def checkpoint_section(results: dict[tuple[str, int], list[CheckpointRow]]
                       ) -> tuple[Tables, list[str]]:
    """One trade-off table per (precision, context)."""
    tables, notes = [], []
    for (precision, t), rows in results.items():
        tables.append((f"activation checkpointing: {precision}, context {t}", tradeoff_frame(rows)))
        ok = [r for r in rows
              if r.status == "ok" and r.peak_mib is not None and r.start_mib is not None]
        if len(ok) > 1:
            best = min(ok, key=lambda r: r.peak_mib - r.start_mib)
            notes.append(f"context {t}: the lowest peak above the step's start is with "
                         + (f"groups of {best.group}" if best.group else "no checkpointing"))
    noisy = [r.group for rows in results.values() for r in rows
             if r.step_ms and r.step_ms["n"] > 1 and r.step_ms["max"] > 1.25 * r.step_ms["min"]]
    if noisy:
        notes.append(f"step times varied by more than 25% between steps (group sizes {noisy}): "
                     "the machine was busy; compare times with more --steps on a quiet machine")
    notes.append("saved = one forward's saved tensors; recompute = the estimator's transient of "
                 "one group rebuilt in backward; step time is the median of the timed steps")
    return tables, notes


def records(spec: RunSpec, analysis: str, items: list[tuple[dict, str, dict]], params: int | None,
            message: str = "") -> list[dict]:
    """`kind: "memory"` records: one per (spec changes, status, metrics) item."""
    # An estimate for CUDA may be made on a machine without a GPU: record this machine then.
    here = spec.device if spec.device == "cpu" or dev.cuda_available() else "cpu"
    environment = envmod.capture(torch.device(here))
    out = []
    for changes, status, metrics in items:
        s = {**spec.to_dict(), **changes, "analysis": analysis}
        out.append(make_record(KIND, s, status, environment, params=params,
                               metrics=to_jsonable(metrics) if status == "ok" else None,
                               message=message if status == "ok" else metrics.get("message", "")))
    return out


def plot_contexts(rows: list[PhaseRow], saved: dict[tuple[str, int], SavedReport],
                  estimates: dict[tuple[str, int, str], MemoryEstimate], baseline_mib: float,
                  path: Path) -> Path:
    """PNG: step peaks vs context (measured solid, estimate dashed) and saved bytes vs context."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    label = two_numbers(rows).attrs.get("label", "peak MiB")
    for key in dict.fromkeys((r.precision, r.mode) for r in rows):
        ok = [r for r in rows if (r.precision, r.mode) == key and r.status == "ok"]
        line, = left.plot([r.context for r in ok], [r.peak() for r in ok], "o-",
                          label=f"{key[0]} {key[1]}")
        est = sorted((t, e) for (p, t, m), e in estimates.items() if (p, m) == key)
        if est:
            left.plot([t for t, _ in est], [baseline_mib + e.total_bytes / MIB for _, e in est],
                      "--", color=line.get_color(), label=f"{key[0]} {key[1]} (estimate)")
    left.set_xlabel("context length T")
    left.set_ylabel(label)
    left.set_title("peak memory of one step")
    left.legend(fontsize=8)
    for precision in dict.fromkeys(p for p, _ in saved):
        pts = sorted((t, r.total() / MIB) for (p, t), r in saved.items() if p == precision)
        right.plot([t for t, _ in pts], [v for _, v in pts], "o-", label=f"{precision} measured")
    right.set_xlabel("context length T")
    right.set_ylabel("MiB")
    right.set_title("activations saved for backward")
    right.legend(fontsize=8)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
