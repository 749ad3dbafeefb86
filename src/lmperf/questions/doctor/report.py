"""The doctor's record (one per run: every check's row, the environment) and its Report, rebuilt
from records alone (for `lmperf doctor`, `lmperf.doctor()` and `lmperf table`)."""

from __future__ import annotations

from collections import Counter

import pandas as pd

from lmperf.core.report import Report
from lmperf.results.schema import make_record, to_jsonable

KIND = "doctor"
COLUMNS = ("check", "device", "status", "result", "why", "seconds")
SHOWN = ("check", "result", "status", "why")


def to_record(rows: list[dict], spec: dict, environment: dict) -> dict:
    """The `kind: "doctor"` record: status 'ok' when no check failed, else 'error' naming the
    failed checks; metrics: {'checks': rows, 'counts': {ok, fail, skip}}."""
    counts = Counter(r["status"] for r in rows)
    failed = [r["check"] for r in rows if r["status"] == "fail"]
    message = f"{len(failed)} check(s) failed: {', '.join(failed)}" if failed else ""
    metrics = {"checks": rows, "counts": {s: counts.get(s, 0) for s in ("ok", "fail", "skip")}}
    return to_jsonable(make_record(KIND, spec, "error" if failed else "ok", environment,
                                   message=message, metrics=metrics))  # type: ignore[return-value]


def _run_label(record: dict) -> str:
    env = record.get("env") or {}
    return f"{env.get('timestamp', '?')} {env.get('device_name', '')}".strip()


def build_report(records: list[dict]) -> Report:
    """The Report of doctor records: frame = one row per check (check, device, status, result,
    why, seconds; plus `run` when there are several records), findings = the counts per run."""
    records = [r for r in records if r.get("kind") == KIND]
    several = len(records) > 1
    rows, findings = [], []
    for record in records:
        checks = (record.get("metrics") or {}).get("checks") or []
        label = _run_label(record)
        for row in checks:
            rows.append({**({"run": label} if several else {}),
                         **{c: row.get(c) for c in COLUMNS}})
        findings.append(_finding(record, checks, label if several else ""))
    frame = pd.DataFrame(rows, columns=(["run"] if several else []) + list(COLUMNS))
    env = (records[-1].get("env") or {}) if records else {}
    title = (f"lmperf doctor on {env.get('device_name', '?')} (torch {env.get('torch', '?')})"
             if records else "lmperf doctor")
    return Report(kind=KIND, frame=frame, findings=findings, records=records, title=title,
                  display=_display)


def _finding(record: dict, checks: list[dict], label: str) -> str:
    counts = Counter(c.get("status") for c in checks)
    skipped_cuda = [c for c in checks if c.get("status") == "skip" and c.get("device") == "cuda"]
    text = (f"{counts.get('ok', 0)} ok, {counts.get('fail', 0)} failed, "
            f"{counts.get('skip', 0)} skipped")
    if skipped_cuda and len(skipped_cuda) == sum(c.get("device") == "cuda" for c in checks):
        text += f" (every CUDA check: {skipped_cuda[0].get('why')})"
    if record.get("status") != "ok":
        text += f"; {record.get('message')}"
    return (f"{label}: " if label else "") + text + "."


def _display(report: Report) -> tuple[pd.DataFrame, str, list[str]]:
    """The table for reading: check, result, status, why (the seconds stay in the record)."""
    cols = (["run"] if "run" in report.frame.columns else []) + list(SHOWN)
    shown = report.frame[cols].copy()
    for col in cols:  # equal widths: the renderer right-aligns, so pad to read left-aligned
        text = shown[col].fillna("").astype(str)
        width = max(len(col), int(text.str.len().max() or 0))
        shown[col] = text.str.ljust(width)
    shown.columns = [c.ljust(len(shown[c].iloc[0]) if len(shown) else len(c)) for c in cols]
    total = float(report.frame["seconds"].fillna(0).sum()) if len(report.frame) else 0.0
    return shown, f"{len(shown)} checks in {total:.1f} s", []
