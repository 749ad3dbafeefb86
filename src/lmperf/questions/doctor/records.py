"""The doctor's records, one per check (its row as the metrics, the environment), and the rows
read back from them; no pandas, no torch (the checks' children write them, `lmperf table` and
the write-up read them).

A check's row has a status of its own (ok / fail / skip); its record's status is the one every
kind shares: ok, error (the check failed, or its job crashed or timed out) or unsupported (the
check cannot run here). Records written before the checks were jobs (every row of a run in
`metrics.checks`) are split into one record per check on read (`lmperf.results.record.migrate`).
"""

from __future__ import annotations

import math

from lmperf.results.schema import make_record, to_jsonable

KIND = "doctor"
RECORD_STATUS = {"ok": "ok", "fail": "error", "skip": "unsupported"}
"""A check's status -> its record's status."""
NO_ANSWER = "its job ended without an answer (the record keeps the log's tail)"


def check_record(row: dict, spec: dict, environment: dict) -> dict:
    """The `kind: "doctor"` record of one check: its row as the metrics (check, device = the
    scope, status, result, why, seconds, values), its status by `RECORD_STATUS`, the message
    'result: why' when it failed and 'why' when it was skipped."""
    status = RECORD_STATUS[row["status"]]
    message = {"ok": "", "error": f"{row['result']}: {row['why']}", "unsupported": row["why"]}
    return to_jsonable(make_record(KIND, spec, status, environment, message=message[status],
                                   metrics=row))  # type: ignore[return-value]


def skipped_record(spec: dict, why: str, environment: dict) -> dict:
    """The record of a check whose scope cannot run here (made without running anything)."""
    row = {"check": spec["check"], "device": spec["scope"], "status": "skip", "result": "-",
           "why": why, "seconds": 0.0, "values": {}}
    return check_record(row, spec, environment)


def rows_of(record: dict) -> list[dict]:
    """The check rows a doctor record holds: its own row, or, for a job that crashed or timed
    out (no row), a 'fail' row per check of the job with the launcher's message."""
    metrics = record.get("metrics") or {}
    if "check" in metrics:
        return [metrics]
    spec = record.get("spec") or {}
    message = " ".join(str(record.get("message", "")).split())[:160]
    return [{"check": name, "device": spec.get("scope"), "status": "fail", "result": message,
             "why": NO_ANSWER, "seconds": math.nan, "values": {}} for name in checks_of(record)]


def checks_of(record: dict) -> list[str]:
    """The checks a doctor record is about: its check, or (a job's failure, made by the
    launcher with the job's spec) every check of the job."""
    spec = record.get("spec") or {}
    return [spec["check"]] if "check" in spec else list(spec.get("checks") or [])


def latest_rows(records: list[dict]) -> list[dict]:
    """One row per check: the latest of its doctor records (a resumed run reruns only some),
    in the order the checks first appear."""
    latest: dict[str, dict] = {}
    for record in records:
        if record.get("kind") == KIND:
            for row in rows_of(record):
                latest[row["check"]] = row
    return list(latest.values())


def summary_line(record: dict) -> str:
    """A finished check's progress line: 'check: result', and why when it did not pass."""
    row = (rows_of(record) or [{}])[0]
    why = f" ({row.get('why')})" if row.get("status") != "ok" else ""
    return f"{row.get('check', '?')}: {row.get('result', '')}{why}"
