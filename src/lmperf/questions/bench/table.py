"""The benchmark table: a numeric DataFrame of bench records (CSV, analysis) and a display
table (terminal, Markdown, LaTeX) laid out like the course's: size, context, precision, then the
median per phase with the step's mean +- std beside it. Size and precision are columns always
(the same columns on every machine); other axes that hold one value across all rows (the
model's shape among them) move into the caption and notes under the table.
"""

from __future__ import annotations

import math

import pandas as pd

from lmperf.core.report import caption_axes, human_bytes, median_columns, status_notes
from lmperf.model.shape import record_dims
from lmperf.units import MIB

PHASES: tuple[str, ...] = ("forward", "backward", "optimizer", "step")
AXES: tuple[tuple[str, str], ...] = (  # (spec field, column title): constant ones go to the caption
    ("batch", "batch"), ("mode", "mode"), ("attention", "attention"),
    ("warmup", "warmup"), ("optimizer", "optimizer"), ("threads", "threads"), ("device", "device"),
    ("course", "course"), ("compile", "compile"), ("checkpoint", "checkpoint"),
    ("grad_accum", "grad_accum"), ("float8", "float8"),
)
# axes named only where some run left their default (older records: the default)
RARE = {"checkpoint": "none", "grad_accum": 1, "float8": "none"}


def _model_name(spec: dict) -> str:
    return spec.get("model") or spec.get("size") or "?"


def _peak_mib(metrics: dict) -> float | None:
    phases = (metrics.get("memory") or {}).get("phases") or {}
    values = [v for p in phases.values() for k, v in p.items() if k in ("allocated", "rss") and v is not None]
    return max(values) if values else None


def records_frame(records: list[dict]) -> pd.DataFrame:
    """One row per record, numeric columns with units in their names (for CSV and analysis)."""
    rows = []
    for r in records:
        spec, m = r["spec"], r.get("metrics") or {}
        row = {
            "model": _model_name(spec), "shape": record_dims(r), "params": r.get("params"),
            "context": spec.get("context"), "batch": spec.get("batch"),
            "precision": spec.get("precision"), "mode": spec.get("mode"),
            "attention": spec.get("attention"), "warmup": spec.get("warmup"),
            "optimizer": spec.get("optimizer"), "threads": spec.get("threads", 0),
            "course": spec.get("course"),
            "compile": "on" if spec.get("compile") else "off",
            "checkpoint": spec.get("checkpoint", "none"), "grad_accum": spec.get("grad_accum", 1),
            "float8": spec.get("float8", "none"),
            "compile_s": m.get("compile_s"),
            "device": spec.get("device"), "status": r["status"], "message": r.get("message", ""),
        }
        for phase in PHASES:
            s = m.get(f"{phase}_ms") or {}
            for stat in ("mean", "std", "median", "iqr", "n"):
                row[f"{phase}_ms_{stat}"] = s.get(stat)
        row.update({
            "rounds": r.get("rounds"),
            "step_ms_round_spread": (m.get("step_ms") or {}).get("round_spread"),
            "tokens_per_s": m.get("tokens_per_s"), "flops_per_step": m.get("flops_per_step"),
            "tflops": m.get("tflops"), "mfu": m.get("mfu"), "peak_memory_mib": _peak_mib(m),
            "memory_kind": (m.get("memory") or {}).get("kind"),
            "device_name": (r.get("env") or {}).get("device_name"),
            "timestamp": (r.get("env") or {}).get("timestamp"),
            "sweep": r.get("sweep"),  # which run of the command (None: written before issue 43)
        })
        rows.append(row)
    return pd.DataFrame(rows)


def _fmt(value: object, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def run_times(df: pd.DataFrame) -> list[str]:
    """When each row's command ran ('06:31:02', with the date where the rows span days): its
    sweep's start, else (older records) the record's own time."""
    stamps = [str(s or t or "-") for s, t in zip(df["sweep"], df["timestamp"])]
    days = {s[:10] for s in stamps}
    return [s[:19].replace("T", " ") if len(days) > 1 else s[11:19] or s for s in stamps]


def display_frame(records: list[dict]) -> tuple[pd.DataFrame, str, list[str]]:
    """(table, caption, notes): the human-facing table, the median per phase first.

    The caption names the axes that are the same in every row; notes, one line each, name the
    model when there is one, the FLOP convention and the clock, then the message of every row
    that is not ok, numbered as referenced from the status column.
    """
    df = records_frame(records)
    if df.empty:
        return pd.DataFrame(), "no records", []
    # params from the records, not the frame: a None beside ints would turn the column to floats
    df["params"] = [_fmt(r.get("params"), ",") for r in records]
    model = [("model", "size")]  # a preset's name is its shape: the shape goes to the note
    if any(r["spec"].get("model") for r in records):
        model += caption_axes(df, [("shape", "shape")])[0]
    # precision stays a column where it holds one value (a CPU without native bf16 runs fp32)
    # checkpointing, accumulation and float8 named only where some run used them
    axes = [(t, t) for c, t in AXES if c not in RARE or (df[c] != RARE[c]).any()]
    varying, caption = caption_axes(df, [("context", "context"), ("precision", "precision")]
                                    + axes, keep=("precision",))
    # each model named once, under the table: its shape and parameters
    named = df.drop_duplicates(["model", "shape"])
    notes = ["model" + ("s" if len(named) > 1 else "") + ": " + "; ".join(
        f"{m} ({s}), {p} parameters" for m, s, p in zip(named["model"], named["shape"],
                                                        named["params"]))]
    out = pd.DataFrame(index=df.index)
    for col, title in model + varying:
        out[title] = df[col]
    if out.duplicated().any():  # runs of one spec: told apart by when their command ran
        out["run"] = run_times(df)
    out["status"], failed = status_notes(df["status"], df["message"])  # before the figures: kept
    median_columns(out, df, PHASES)
    # TFLOP/s and MFU mean nothing without the FLOP convention (causal attention halved or not)
    conventions = sorted({(r.get("metrics") or {}).get("flops_convention") for r in records} - {None})
    notes += [f"FLOPs: {c}" for c in conventions]
    if df["compile_s"].notna().any():
        out["compile (s)"] = [_fmt(v, ".1f") for v in df["compile_s"]]
    if df["step_ms_round_spread"].notna().any():
        out["round spread"] = [_fmt(v, ".1%") for v in df["step_ms_round_spread"]]
    out["tokens/s"] = [_fmt(v, ",.0f") for v in df["tokens_per_s"]]
    if df["mfu"].notna().any():  # a CPU has no peak: its TFLOP/s are in the CSV
        out["TFLOP/s"] = [_fmt(v, ".3f") for v in df["tflops"]]
        out["MFU"] = [_fmt(v, ".1%") for v in df["mfu"]]
    kinds = set(df["memory_kind"].dropna())
    mem_title = "peak GPU" if kinds == {"cuda_allocator"} else (
        "peak RSS" if kinds == {"cpu_process_peak_rss"} else "peak memory")
    if mem_title == "peak RSS":
        notes.append("peak RSS: of the CPU process (Python and torch included), not GPU memory")
    out[mem_title] = [human_bytes(v * MIB) if v is not None else "-" for v in df["peak_memory_mib"]]
    if any((r.get("metrics") or {}).get("timer_sync") == "step" for r in records):
        notes.append("tokens/s from the step's median; one device sync per step (none between "
                     "its phases)")
    return out, caption, notes + failed
