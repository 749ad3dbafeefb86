"""The doctor's Report, rebuilt from its records alone (for `lmperf doctor`, `lmperf.doctor()`
and `lmperf table`): one row per check, its latest record's (see `doctor.records`)."""

from __future__ import annotations

import pandas as pd

from lmperf.core.report import Report
from lmperf.questions.doctor.records import KIND, checks_of, latest_rows, rows_of

COLUMNS = ("check", "device", "status", "result", "why", "seconds")


def counts(frame: pd.DataFrame) -> dict[str, int]:
    """{'ok', 'fail', 'skip'} -> how many rows of the frame have it."""
    seen = frame["status"].value_counts()
    return {s: int(seen.get(s, 0)) for s in ("ok", "fail", "skip")}


def build_report(records: list[dict]) -> Report:
    """The Report of doctor records: frame = one row per check, its latest (check, device,
    status, result, why, seconds), headline = the counts and the failed checks."""
    from lmperf.questions.doctor.registry import NAMES

    order = {name: i for i, name in enumerate(NAMES)}  # the table's order, not the finishing one
    records = sorted([r for r in records if r.get("kind") == KIND],
                     key=lambda r: min((order.get(c, len(order)) for c in checks_of(r)),
                                       default=len(order)))
    rows = latest_rows(records)
    frame = pd.DataFrame([{c: row.get(c) for c in COLUMNS} for row in rows], columns=list(COLUMNS))
    frame["seconds"] = pd.to_numeric(frame["seconds"], errors="coerce")
    env = (records[-1].get("env") or {}) if records else {}
    title = (f"lmperf doctor on {env.get('device_name', '?')} (torch {env.get('torch', '?')})"
             if records else "lmperf doctor")
    earlier = sum(len(rows_of(r)) for r in records) - len(rows)
    findings = [f"{earlier} earlier row(s) of the same checks are in the records; each check "
                "shows its latest."] if earlier else []
    return Report(kind=KIND, frame=frame, findings=findings, records=records, title=title,
                  display=_display, headline=headline(rows, frame))


def headline(rows: list[dict], frame: pd.DataFrame) -> list[str]:
    """The answer: 'N ok, N failed, N skipped', the failed checks by name."""
    n = counts(frame)
    text = f"{n['ok']} ok, {n['fail']} failed, {n['skip']} skipped"
    failed = [r["check"] for r in rows if r.get("status") == "fail"]
    if failed:
        text += f"; {len(failed)} check(s) failed: {', '.join(failed)}"
    return [text + "."]


def _display(report: Report) -> tuple[pd.DataFrame, str, list[str]]:
    """The table for reading: check, status, result, one row per check that ran; the checks
    skipped for one reason are one row ("23 CUDA checks skipped"), the reason in a note. A
    failed check's criterion (why) is a note; an ok one's stays in the record, as do the
    seconds. Text cuts long results to the screen; Markdown and the records keep them."""
    frame = report.frame
    skipped = frame[frame["status"] == "skip"]
    reasons = list(dict.fromkeys(skipped["why"]))
    rows, notes = [], []
    for _, row in frame.iterrows():
        if row["status"] == "skip" and row["why"] in reasons:
            group = skipped[skipped["why"] == row["why"]]
            if row["check"] != group["check"].iloc[0]:
                continue  # one row per reason, where its first check stands
            notes.append(f"[{len(notes) + 1}] skipped: {row['why']}")
            scope = {"cuda": "CUDA ", "cpu": "CPU "}.get(str(row["device"]), "")
            name = row["check"] if len(group) == 1 else f"{len(group)} {scope}checks"
            rows.append((name, f"skip [{len(notes)}]", "-" if len(group) == 1 else
                         ", ".join(group["check"])))
        elif row["status"] == "fail":
            notes.append(f"[{len(notes) + 1}] {row['check']} failed; it checks: {row['why']}")
            rows.append((row["check"], f"FAIL [{len(notes)}]", row["result"]))
        else:
            rows.append((row["check"], row["status"], row["result"]))
    total = float(frame["seconds"].fillna(0).sum()) if len(frame) else 0.0
    notes.append(f"{len(frame)} checks, {total:.1f} s of checking; each check's criterion: "
                 "--format markdown or --json")
    return pd.DataFrame(rows, columns=["check", "status", "result"]), "", notes
