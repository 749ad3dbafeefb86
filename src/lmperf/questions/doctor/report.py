"""The doctor's Report, rebuilt from its records alone (for `lmperf doctor`, `lmperf.doctor()`
and `lmperf table`): one row per check, its latest record's (see `doctor.records`)."""

from __future__ import annotations

from collections import Counter

import pandas as pd

from lmperf.core.report import Report
from lmperf.questions.doctor.records import KIND, latest_rows, rows_of

COLUMNS = ("check", "device", "status", "result", "why", "seconds")
SHOWN = ("check", "result", "status", "why")


def counts(frame: pd.DataFrame) -> dict[str, int]:
    """{'ok', 'fail', 'skip'} -> how many rows of the frame have it."""
    seen = Counter(frame["status"]) if len(frame) else Counter()
    return {s: int(seen.get(s, 0)) for s in ("ok", "fail", "skip")}


def build_report(records: list[dict]) -> Report:
    """The Report of doctor records: frame = one row per check, its latest (check, device,
    status, result, why, seconds), findings = the counts, the failed checks, and the reason
    when every CUDA check was skipped."""
    records = [r for r in records if r.get("kind") == KIND]
    rows = latest_rows(records)
    frame = pd.DataFrame([{c: row.get(c) for c in COLUMNS} for row in rows], columns=list(COLUMNS))
    frame["seconds"] = pd.to_numeric(frame["seconds"], errors="coerce")
    env = (records[-1].get("env") or {}) if records else {}
    title = (f"lmperf doctor on {env.get('device_name', '?')} (torch {env.get('torch', '?')})"
             if records else "lmperf doctor")
    earlier = sum(len(rows_of(r)) for r in records) - len(rows)
    return Report(kind=KIND, frame=frame, findings=_findings(rows, frame, earlier),
                  records=records, title=title, display=_display)


def _findings(rows: list[dict], frame: pd.DataFrame, earlier: int) -> list[str]:
    n = counts(frame)
    text = f"{n['ok']} ok, {n['fail']} failed, {n['skip']} skipped"
    cuda = [r for r in rows if r.get("device") == "cuda"]
    if cuda and all(r.get("status") == "skip" for r in cuda):
        text += f" (every CUDA check: {cuda[0].get('why')})"
    failed = [r["check"] for r in rows if r.get("status") == "fail"]
    if failed:
        text += f"; {len(failed)} check(s) failed: {', '.join(failed)}"
    findings = [text + "."]
    if earlier:
        findings.append(f"{earlier} earlier row(s) of the same checks are in the records; each "
                        "check shows its latest.")
    return findings


def _display(report: Report) -> tuple[pd.DataFrame, str, list[str]]:
    """The table for reading: check, result, status, why (the seconds stay in the record)."""
    cols = list(SHOWN)
    shown = report.frame[cols].copy()
    for col in cols:  # equal widths: the renderer right-aligns, so pad to read left-aligned
        text = shown[col].fillna("").astype(str)
        width = max(len(col), int(text.str.len().max() or 0))
        shown[col] = text.str.ljust(width)
    shown.columns = [c.ljust(len(shown[c].iloc[0]) if len(shown) else len(c)) for c in cols]
    total = float(report.frame["seconds"].fillna(0).sum()) if len(report.frame) else 0.0
    return shown, f"{len(shown)} checks, {total:.1f} s of checking", []
