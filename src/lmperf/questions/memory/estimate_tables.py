"""The tables and findings of simulated estimates, from their records alone (numbers stay
numeric; GiB = 2**30, MiB = 2**20)."""

from __future__ import annotations

import math

import pandas as pd

from lmperf.estimate.checkpoint_plan import sqrt_rule
from lmperf.validate import checkpoint_phrase, checkpoint_policy
from lmperf.units import GIB
from lmperf.questions.memory.estimate_sim import METHOD, reconcile_rows
from lmperf.estimate.simulate import ALLOWANCE_NOTE, CATEGORIES

Tables = dict[str, pd.DataFrame]
MAX_EXPLAINED = 4  # reconciliation tables shown (the frame and JSON records have every row)


def simulated(records: list[dict]) -> list[dict]:
    """The ok 'estimate' records that hold a simulation (older files' recursive-bisection rows,
    no longer simulated, left out)."""
    return [r for r in records if r["spec"].get("analysis") == "estimate"
            and r["status"] == "ok" and "simulation" in (r.get("metrics") or {})
            and r["spec"].get("checkpoint_schedule", "uniform") == "uniform"]


def _group(spec: dict) -> str:
    return str(spec.get("checkpoint_group") or "none")


def summary_frame(records: list[dict]) -> pd.DataFrame:
    """One row per (mode, precision, context, group): the simulated peak, per-phase peaks, the
    composition at the peak, the allowance, the estimate, and the analytic sum of terms."""
    rows = []
    for r in records:
        s, m = r["spec"], r["metrics"]
        sim = m["simulation"]
        row = {"mode": s["mode"], "precision": s["precision"], "context": s["context"],
               "group": _group(s), "peak GiB": sim["peak_bytes"] / GIB,
               "peak phase": sim["peak_phase"]}
        for phase in ("forward", "backward", "optimizer"):
            value = sim["phase_peaks"].get(phase)
            row[f"{phase} GiB"] = value / GIB if value is not None else None
        # At the peak; inputs & buffers (token ids, RoPE tables) are in the frame's sums only.
        row.update({f"{c} GiB": sim["composition"][c] / GIB for c in CATEGORIES
                    if c != "inputs & buffers"})
        row["recomputed block forwards"] = sim.get("recomputed_blocks")
        row["allowance GiB"] = sim["allowance_bytes"] / GIB
        row["estimate GiB"] = sim["total_bytes"] / GIB
        est = m.get("estimate")
        row["analytic sum GiB"] = est["total_bytes"] / GIB if est else None
        if m.get("gib") is not None:
            row["fits"] = m["fits"]
        rows.append(row)
    frame = pd.DataFrame(rows)
    if (frame["group"] == "none").all():  # no checkpointing asked: no recompute column
        frame = frame.drop(columns="recomputed block forwards")
    if frame["analytic sum GiB"].isna().all():  # a user's model has no analytic terms
        frame = frame.drop(columns="analytic sum GiB")
    return frame


def estimate_sim_section(records: list[dict]) -> tuple[Tables, list[str]]:
    """The summary table, a few reconciliation tables (analytic terms vs alive at the peak),
    and the findings: method, allowance, budget verdicts, checkpointing's best choice."""
    records = simulated(records)
    if not records:
        return {}, []
    s0 = records[0]["spec"]
    tables: Tables = {f"estimate ({s0.get('device')}), simulated step: one row per mode, "
                      "precision, context and checkpoint group": summary_frame(records)}
    # a user's model has no analytic terms: the composition at the peak is in the summary
    explained = [r for r in records if _group(r["spec"]) == "none"
                 and r["metrics"].get("estimate")][-MAX_EXPLAINED:]
    for r in explained:
        s = r["spec"]
        tables[f"where it goes: {s['mode']}, {s['precision']}, context {s['context']} "
               "(analytic terms vs alive at the simulated peak)"] = pd.DataFrame(
                   reconcile_rows(r["metrics"]["simulation"], r["metrics"].get("estimate")))
    notes = [METHOD + ". The analytic terms explain where memory goes; their sum counts every "
             "term at once, which never happens (the estimate is the simulated peak, not an "
             "upper bound)"]
    if any(r["metrics"]["simulation"]["allowance_bytes"] for r in records):
        notes.append(ALLOWANCE_NOTE + "; CUDA blocks rounded to 512 B in the simulation, "
                     "segments (2 MiB / 20 MiB) not modelled")
    else:
        notes.append("CPU: tensor bytes only; a process also holds Python, torch and its "
                     "thread pools (see the README's comparison with lmperf memory's RSS)")
    notes += sorted({n for r in records for n in r["metrics"]["simulation"]["notes"]})
    budget = next((r["metrics"] for r in records if r["metrics"].get("gib") is not None), None)
    if budget:  # the verdict is the table's "fits" column, the budget said once
        notes.append(f"fits: estimate <= {budget['gib']:.3g} GiB" + (
            f" ({budget['gpu']}'s memory)" if budget.get("gpu") else
            f" ({budget['budget']})" if budget.get("budget") else " (--gib)"))
    notes += _checkpoint_notes(records)
    return tables, notes


def _checkpoint_notes(records: list[dict]) -> list[str]:
    """Per training (mode, precision, context) with several groups: the memory-optimal group
    and the sqrt(N) rule's."""
    notes = []
    keys = dict.fromkeys((r["spec"]["mode"], r["spec"]["precision"], r["spec"]["context"])
                         for r in records if r["spec"]["mode"] != "forward")
    for key in keys:
        rows = [r for r in records
                if (r["spec"]["mode"], r["spec"]["precision"], r["spec"]["context"]) == key]
        if len(rows) < 2:
            continue
        peak = {_group(r["spec"]): r["metrics"]["simulation"] for r in rows}
        layers = rows[0]["spec"]["num_layers"]
        best = min(peak, key=lambda g: (peak[g]["peak_bytes"], g != "none"))
        where = f"{key[0]}, {key[1]}, context {key[2]}"
        line = (f"{where}: lowest simulated peak with {checkpoint_phrase(checkpoint_policy(best))} "
                f"({peak[best]['peak_bytes'] / GIB:.2f} GiB; none: "
                f"{peak.get('none', {}).get('peak_bytes', math.nan) / GIB:.2f} GiB)")
        g = str(checkpoint_policy(sqrt_rule(layers)))
        if g in peak:
            line += (f"; the sqrt(N) rule (N = {layers} blocks) gives groups of "
                     f"{sqrt_rule(layers)}: "
                     f"{peak[g]['peak_bytes'] / GIB:.2f} GiB, +1 forward of every block")
        notes.append(line)
        tops = {v["peak_phase"] for v in peak.values()}
        if tops == {"optimizer"}:
            notes.append(f"{where}: every peak is in the optimizer step (parameters, gradients, "
                         "AdamW state and its temporaries), which checkpointing cannot lower")
    return notes
