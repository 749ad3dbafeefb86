"""The Report of memory records, rebuilt from the records alone (the run's output and
`lmperf table results/memory.jsonl` are the same): a numeric frame with one row per record,
the tables of each analysis, and the findings."""

from __future__ import annotations

import pandas as pd

from lmperf.core.report import Report
from lmperf.model.shape import dims, record_dims
from lmperf.questions.memory import readback
from lmperf.units import GIB, MIB
from lmperf.validate import checkpoint_phrase
from lmperf.questions.memory.estimate_tables import estimate_sim_section, simulated
from lmperf.questions.memory.tables import (
    checkpoint_section, phases_section, saved_section,
)

KIND = "memory"
PHASE_NAMES: tuple[str, ...] = ("forward", "backward", "optimizer")
INT_COLUMNS: tuple[str, ...] = ("params", "context", "batch", "warmup",
                                "threads", "saved_bytes", "saved_activation_bytes",
                                "estimate_bytes")
FLOAT_COLUMNS: tuple[str, ...] = ("peak_forward_mib", "peak_backward_mib", "peak_optimizer_mib",
                                  "peak_mib", "peak_reserved_mib", "start_mib", "baseline_mib",
                                  "step_ms_median", "gib")


def _phase_peaks(record: dict) -> dict[str, float | None]:
    """Peak MiB per phase and over the step (RSS on the CPU, allocated on CUDA), and reserved."""
    phases = (((record.get("metrics") or {}).get("memory") or {}).get("phases")) or {}
    key = "rss" if readback.memory_kind(record) == "cpu_process_peak_rss" else "allocated"
    out = {f"peak_{p}_mib": (phases.get(p) or {}).get(key) for p in PHASE_NAMES}
    values = [v for v in out.values() if v is not None]
    out["peak_mib"] = max(values) if values else None
    reserved = [v.get("reserved") for v in phases.values() if v.get("reserved") is not None]
    out["peak_reserved_mib"] = max(reserved) if reserved else None
    start = (record.get("metrics") or {}).get("start") or {}
    out["start_mib"] = start.get(key)
    return out


def _estimate_bytes(record: dict) -> float | None:
    """The analytic figure a record compares with: the step's total (phases, estimate), the
    saved bytes (saved, checkpoint)."""
    analysis, m = record["spec"].get("analysis"), record.get("metrics") or {}
    if readback.is_job_record(record):
        return None
    if analysis == "estimate":  # the simulated estimate; older records: the analytic sum
        return (m.get("simulation") or m.get("estimate") or {}).get("total_bytes")
    if analysis == "checkpoint":
        return m.get("expected_saved_bytes")
    est = readback.estimate_for(record, "train-step" if analysis == "saved" else None)
    if est is None:
        return None
    return est.saved_bytes if analysis == "saved" else est.total_bytes


def records_frame(records: list[dict]) -> pd.DataFrame:
    """One numeric row per record: what was run (analysis, shape, context, precision, mode,
    checkpoint group), how it ended, and its figures (MiB, bytes, ms; units in the names)."""
    rows = []
    for r in records:
        spec, m = r["spec"], r.get("metrics") or {}
        saved = m.get("saved") or {}
        row = {
            "analysis": spec.get("analysis"), "model": spec.get("model") or spec.get("size"),
            "shape": record_dims(r),
            "params": r.get("params"), "context": readback.context_of(r),
            "batch": spec.get("batch"), "precision": spec.get("precision"),
            "mode": spec.get("mode"), "attention": spec.get("attention"),
            "checkpoint_group": spec.get("checkpoint_group"),
            "warmup": spec.get("warmup"),
            "device": spec.get("device"), "threads": spec.get("threads"),
            "status": r["status"], "message": r.get("message", ""),
            "memory_kind": readback.memory_kind(r),
        }
        if readback.is_job_record(r) and spec.get("analysis") == "phases":
            row["mode"] = " ".join(spec.get("modes") or [])  # the job measured each
        row.update(_phase_peaks(r))
        if spec.get("analysis") == "checkpoint":
            row["peak_mib"], row["start_mib"] = m.get("peak_mib"), m.get("start_mib")
        saved_total = (saved["activation_bytes"] + saved.get("weight_copy_bytes", 0)
                       if saved else m.get("saved_bytes"))
        row.update({
            "baseline_mib": m.get("baseline_mib"),
            "saved_bytes": saved_total,  # what autograd keeps: activations + weight copies
            "saved_activation_bytes": saved.get("activation_bytes"),
            "estimate_bytes": _estimate_bytes(r),
            "step_ms_median": (m.get("step_ms") or {}).get("median"),
            "fits": m.get("fits"), "gib": m.get("gib"),
        })
        rows.append(row)
    frame = pd.DataFrame(rows)
    for col in INT_COLUMNS:  # counts stay integers where a row has none (NA, not NaN floats)
        if col in frame:
            frame[col] = pd.array([None if pd.isna(v) else int(v) for v in frame[col]],
                                  dtype="Int64")
    for col in FLOAT_COLUMNS:
        if col in frame:
            frame[col] = pd.to_numeric(frame[col], errors="coerce").astype(float)
    return frame


def _display(report: Report) -> tuple[pd.DataFrame, str, list[str]]:
    """The frame is for CSV and notebooks; read as text it is the analyses' tables (shown as
    they are), unless there are none, e.g. a file of failed jobs only: then the frame's
    essentials."""
    if any(not df.empty for df in report.tables.values()):
        return pd.DataFrame(), "", []
    cols = ["analysis", "model", "context", "precision", "mode", "status", "message"]
    return report.frame[[c for c in cols if c in report.frame.columns]], "", []


def setup(record: dict) -> str:
    """What a record's tables are about: the model and its shape, batch, attention, device."""
    s = record["spec"]
    return (f"{s.get('model') or s.get('size')} ({record_dims(record)}), batch {s.get('batch')}, "
            f"{s.get('attention')} attention, {s.get('device')}")


def sections(records: list[dict]) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """Every analysis' tables and findings, in the order the command runs them. A file that
    holds runs of several setups (model, batch, attention, device) gets each setup's tables,
    titled with it, so that runs of different models never share a table."""
    setups = list(dict.fromkeys(setup(r) for r in records))
    if len(setups) == 1:
        return _sections(records)
    tables: dict[str, pd.DataFrame] = {}
    findings: list[str] = []
    for name in setups:
        more, notes = _sections([r for r in records if setup(r) == name])
        tables.update({f"{name}: {title}": df for title, df in more.items()})
        findings += [f"{name}: {note}" for note in notes]
    return tables, findings


def _sections(records: list[dict]) -> tuple[dict[str, pd.DataFrame], list[str]]:
    tables: dict[str, pd.DataFrame] = {}
    findings: list[str] = []
    rows = readback.phase_rows(records)
    if rows:
        estimates = readback.phase_estimates(records)
        more, notes = phases_section(rows, estimates, readback.baseline(records))
        tables.update(more)
        findings += notes
    for part in (saved_section(readback.saved(records)),
                 estimate_sim_section(records),
                 checkpoint_section(readback.checkpoint_rows(records))):
        tables.update(part[0])
        findings += part[1]
    # Job-level failures (a child that died, timed out or failed before its first row).
    findings += [f"{r['spec'].get('analysis')} job ({r['spec'].get('precision')}, contexts "
                 f"{', '.join(map(str, r['spec'].get('contexts', [])))}): {r['status']} "
                 f"({' '.join(str(r.get('message', '')).split())})"
                 for r in records if readback.is_job_record(r)]
    return tables, findings


# Text keeps to the answer: the peaks per step, the saved tensors and the estimate (their main
# columns); every other table comes with --details (and in Markdown and the write-up).
BRIEF = {"peak memory per step": None, "activation checkpointing": None,
         "saved for backward (": ["precision", "context", "activations MiB", "estimate MiB",
                                  "error", "per block MiB", "block x residual"],
         "estimate (": ["mode", "precision", "context", "group", "estimate GiB", "peak GiB",
                        "peak phase", "recomputed block forwards", "fits"]}


def headline(records: list[dict]) -> list[str]:
    """The answer in a line or three: the largest peak of a step and whether every step fit,
    what autograd saves at the longest context, the simulated estimate against its budget."""
    lines, rows = [], readback.phase_rows(records)
    failed = [f"{r.precision} {r.mode} at context {r.context}: {r.status}" for r in rows
              if r.status != "ok"]  # only an oom row says it does not fit; others did not run
    oom = [f for f in failed if f.endswith(": oom")]
    if (ok := [r for r in rows if r.status == "ok" and r.peak() is not None]):
        top = max(ok, key=lambda r: r.peak())
        what = "RSS of the process" if top.memory_kind == "cpu_process_peak_rss" else "allocated"
        lines.append(f"peak of a step: {top.peak():,.0f} MiB ({what}), {top.precision} {top.mode} "
                     f"at context {top.context}; " + (
                         "does not fit: " + ", ".join(oom[:2]) if oom else
                         "did not run: " + ", ".join(failed[:2]) if failed else
                         "fits: every step ran"))
    if (saved := readback.saved(records)):
        (precision, t), rep = max(saved.items(), key=lambda kv: kv[0][1])
        lines.append(f"saved for backward at context {t} ({precision}): "
                     f"{(rep.activation_bytes + rep.weight_copy_bytes) / MIB:,.1f} MiB" + (
                         f"; T x T tensors (scores, probabilities, mask) "
                         f"{rep.square_bytes / rep.activation_bytes:.0%} of it"
                         if rep.square_bytes and rep.activation_bytes else ""))
    if (sims := [r["metrics"] | r["spec"] for r in simulated(records)]):
        m, fit = max(sims, key=lambda m: m["simulation"]["total_bytes"]), sims[0]
        n = f"{sum(bool(s['fits']) for s in sims)} of {len(sims)}"
        where = ("no budget to hold it against: --gib N or --gpu NAME" if fit.get("gib") is None else
                 f"{n} fit on {fit['gpu']} ({fit['gib']:.3g} GiB)" if fit.get("gpu") else
                 f"{n} fit in {fit['gib']:.3g} GiB {fit.get('budget', '')}".rstrip())
        lines.append(f"estimated peak (simulated): {m['simulation']['total_bytes'] / GIB:.3g} GiB, "
                     f"{m['model'] or m['size']} {m['precision']} {m['mode']} at context "
                     f"{m['context']}, {assumed(m)}; {where}")
        lines += [fits_line(s) for s in sims if s.get("what_fits")]
    return lines


def assumed(spec: dict) -> str:
    """What an estimate assumed that changes it: batch, attention (sdpa for a GPU: lmperf
    plan's), checkpointing, and for a training step the optimizer."""
    group = checkpoint_phrase(spec.get("checkpoint_group", "none"))
    gpu = " (--gpu's default, as lmperf plan)" if spec.get("gpu") and spec["attention"] == "sdpa" else ""
    return (f"batch {spec['batch']}, {spec['attention']} attention{gpu}, {group}"
            + (f", AdamW {spec['optimizer']}" if spec["mode"] == "train-step" else ""))


def fits_line(spec: dict) -> str:
    """What would make a row that does not fit fit (`estimate_sim.what_fits`)."""
    found = spec["what_fits"]
    head = (f"{spec['precision']} {spec['mode']} at context {spec['context']} does not fit "
            f"({spec['simulation']['total_bytes'] / GIB:.3g} GiB): ")
    if "gpus" not in found[0]:
        return head + "fits with " + "; or ".join(f"`{f['flags']}` ({f['gib']:.3g} GiB)"
                                                  for f in found)
    f = found[0]
    gpus = (f"about {f['gpus']} GPUs with the states sharded (FSDP)" if f["gpus"] else
            "more GPUs than sharding the states gives")
    return (head + f"not on one even with `{f['flags']}` ({f['gib']:.3g} GiB); {gpus}: "
            f"`lmperf plan --size {spec['model'] or spec['size']} --context {spec['context']}"
            + (f" --gpu {spec['gpu']}" if spec.get("gpu") else f" --gib {spec['gib']:g}")
            + f" --gpus {f['gpus'] or 8}` searches them")


def built(records: list[dict]) -> list[str]:
    """For a user's model: its shape and parameters read off the model its factory built (a
    factory may ignore the shape it is handed), first among the findings."""
    r = next((r for r in records if r.get("model_shape")), None)
    if r is None:
        return []
    s, shape = r["spec"], r["model_shape"]
    return [f"model {s['model']}: {dims(shape, vocab=True)}, {shape['params']:,} parameters "
            f"(read off the model its factory built when handed {s['size']}'s shape, "
            f"{dims(s, vocab=True)})"]


def build_report(records: list[dict]) -> Report:
    """A Report of memory records (others are ignored): `frame` has one numeric row per record;
    `tables` are the analyses' tables (peaks per step and phase, saved tensors, estimates,
    checkpointing), `findings` their sentences, `headline` the answer."""
    records = [r for r in records if r["kind"] == KIND]
    tables, findings = sections(records)
    device = next((r.get("env", {}).get("device_name") for r in records
                   if r.get("env", {}).get("device_name")), "")
    return Report(kind=KIND, frame=records_frame(records), tables=tables,
                  findings=built(records) + findings,
                  records=records, title=f"lmperf memory on {device}" if device else "lmperf memory",
                  display=_display, headline=headline(records),
                  brief={name: next(((cols, None) for key, cols in BRIEF.items()
                                     if name.startswith(key) or f": {key}" in name), None)
                         for name in tables})


def summary_line(record: dict) -> str:
    """One line for a finished record: its main figure, or why it did not run."""
    spec, m = record["spec"], record.get("metrics") or {}
    where = f"context {readback.context_of(record)} {spec.get('mode', '')}".rstrip()
    if record["status"] != "ok":
        return f"{where}: {record['status']}: {record.get('message', '')}"
    analysis = spec.get("analysis")
    if analysis == "phases":
        return f"{where}: peak {_phase_peaks(record)['peak_mib']:,.0f} MiB"
    if analysis == "saved":
        return f"{where}: {m['saved']['activation_bytes'] / MIB:,.1f} MiB saved for backward"
    if analysis == "checkpoint":
        return (f"{where}, {checkpoint_phrase(spec.get('checkpoint_group', 'none'))}: saved "
                f"{(m.get('saved_bytes') or 0) / MIB:,.1f} MiB")
    return where
