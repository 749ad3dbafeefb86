"""`lmperf memory`'s tables and findings, one section per analysis (numeric tables; the Report
formats them when it renders)."""

from __future__ import annotations

import pandas as pd

from lmperf.questions.memory.checkpointing import CheckpointRow, tradeoff_frame
from lmperf.validate import checkpoint_phrase
from lmperf.questions.memory.estimate import MemoryEstimate
from lmperf.units import MIB
from lmperf.questions.memory.phases import MEMORY_LABELS, PhaseRow, phase_frame, two_numbers
from lmperf.questions.memory.readback import SavedSummary

Tables = dict[str, pd.DataFrame]


def phases_section(rows: list[PhaseRow], estimates: dict[tuple[str, int, str], MemoryEstimate],
                   baseline_mib: float | None) -> tuple[Tables, list[str]]:
    """The two-numbers table, the per-phase table, and measured vs estimated step memory."""
    table = two_numbers(rows)
    label = table.attrs.get("label", "peak MiB")
    cpu = label == MEMORY_LABELS["cpu_process_peak_rss"]
    tables = {f"peak memory per step ({label})": table,
              "peak memory per phase (MiB)": phase_frame(rows)}
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
        tables["what a step adds: measured (peak - start) vs estimate (gradients, saved, "
               "recompute, transient allowance)"] = pd.DataFrame(compare)
    notes = [f"{label}: the largest per-phase peak of one step; a step starts holding the "
             "parameters (and AdamW's state after the warm-up step)"]
    if cpu:
        notes.append("CPU figures are the peak resident set of the process that ran the "
                     "measurement (VmHWM, reset per phase, freed memory returned to the OS at "
                     "each phase boundary): process-level memory including Python and torch"
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


def saved_section(reports: dict[tuple[str, int], SavedSummary]) -> tuple[Tables, list[str]]:
    """Saved-for-backward: one summary row per (precision, context); per group and top
    contributors for the longest context of the first precision."""
    rows = []
    for (precision, t), rep in reports.items():
        est = rep.estimate
        measured = rep.activation_bytes + rep.weight_copy_bytes
        first = next(iter(rep.block_bytes().values()), 0)
        rows.append({
            "precision": precision, "context": t, "measured on": rep.measured_on,
            "activations MiB": rep.activation_bytes / MIB,
            "weight copies MiB": rep.weight_copy_bytes / MIB,
            "estimate MiB": est.saved_bytes / MIB if est else None,
            "error": (est.saved_bytes - measured) / measured if est and measured else None,
            "residual MiB": rep.residual_bytes / MIB, "per block MiB": first / MIB,
            "block x residual": first / rep.residual_bytes if rep.residual_bytes else None,
        })
    if not rows:
        return {}, []
    first_precision = rows[0]["precision"]
    (precision, t), rep = max(reports.items(), key=lambda kv: (kv[0][0] == first_precision,
                                                                kv[0][1]))
    blocks = rep.block_bytes()
    notes = []
    if blocks and rep.residual_bytes:
        name, b = next(iter(blocks.items()))
        notes.append(f"at context {t} ({precision}) block {name} saves {b / MIB:,.1f} MiB, "
                     f"{b / rep.residual_bytes:.1f}x the residual stream (B x T x d_model = "
                     f"{rep.residual_bytes / MIB:,.2f} MiB); all {len(blocks)} blocks: "
                     f"{sum(blocks.values()) / max(rep.activation_bytes, 1):.0%} of the "
                     "activations")
    notes.append("bytes are storage bytes, each storage counted once; parameters, RoPE buffers "
                 "and token ids that autograd saves are listed but not counted")
    groups = (pd.DataFrame(rep.groups) if rep.groups else
              pd.DataFrame([{"group": g, "activations MiB": b / MIB}
                            for g, b in rep.per_group.items()]))
    tables = {"saved for backward (activations + autocast weight copies)": pd.DataFrame(rows),
              f"saved for backward per group: {precision}, context {t}": groups,
              f"largest saved activations: {precision}, context {t}": pd.DataFrame(rep.top)}
    for (p, ctx), r in reports.items():  # one block at every context: the course's question
        if r.block and r.block.get("top"):
            b = r.block
            tables[f"one block ({b['name']}): largest saved activations, {p}, context {ctx}"] = (
                pd.DataFrame(b["top"]))
            if b.get("grad_bytes") is not None and (p, ctx) == (precision, t):  # its table's
                notes.append(f"block {b['name']} at context {ctx} ({p}): saves "
                             f"{b['activation_bytes'] / MIB:,.1f} MiB of activations; its "
                             f"{b['params']:,} parameters have {b['grad_bytes'] / MIB:,.1f} MiB of "
                             f"gradients ({b['grad_dtype']})")
    return tables, notes


def checkpoint_section(results: dict[tuple[str, int], list[CheckpointRow]]
                       ) -> tuple[Tables, list[str]]:
    """One trade-off table per (precision, context)."""
    tables, notes = {}, []
    for (precision, t), rows in results.items():
        tables[f"activation checkpointing: {precision}, context {t}"] = tradeoff_frame(rows)
        ok = [r for r in rows
              if r.status == "ok" and r.peak_mib is not None and r.start_mib is not None]
        if len(ok) > 1:
            best = min(ok, key=lambda r: r.peak_mib - r.start_mib)
            notes.append(f"context {t}: the lowest peak above the step's start is with "
                         + checkpoint_phrase(best.group))
        notes += [f"{precision} context {t}, {checkpoint_phrase(r.group)}: {r.status} ({r.message})"
                  for r in rows if r.status != "ok"]
    noisy = [r.group for rows in results.values() for r in rows
             if r.step_ms and r.step_ms["n"] > 1 and r.step_ms["max"] > 1.25 * r.step_ms["min"]]
    if noisy:
        notes.append(f"step times varied by more than 25% between steps (policies {noisy}): "
                     "the machine was busy; compare times with more --steps on a quiet machine")
    if any(r.group == "op" for rows in results.values() for r in rows):
        notes.append("op: its saved outputs sit in torch's selective-checkpoint cache, which "
                     "saved-tensor hooks do not see, so its saved bytes are not measured (its "
                     "peak and time are; memory --estimate simulates them)")
    if results:
        notes.append("saved = one forward's saved tensors; recompute = the estimator's transient "
                     "of one group rebuilt in backward; step time is the median of the timed "
                     "steps")
    return tables, notes
