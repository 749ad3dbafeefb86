"""Which question builds the Report of each record kind (`lmperf.catalog`: by "module:function"
name, so the core imports no question package until a file of that kind is read)."""

from __future__ import annotations

from lmperf.catalog import REPORTS
from lmperf.core.jobs import resolve
from lmperf.core.report import Report


def build_reports(records: list[dict]) -> list[Report]:
    """One Report per record kind found in `records`, in order of first appearance; records of
    a kind no question knows get a generic Report (status and message per row). Records of
    an older schema are migrated first (`results.record.migrate`), as when read from a file,
    so a list loaded by other means renders too."""
    import pandas as pd

    from lmperf.results.record import migrate

    records = migrate(records)
    kinds = list(dict.fromkeys(r["kind"] for r in records))
    reports = []
    for kind in kinds:
        mine = [r for r in records if r["kind"] == kind]
        if kind in REPORTS:
            reports.append(resolve(REPORTS[kind])(mine))
        else:
            frame = pd.DataFrame([{"status": r["status"], "message": r.get("message", "")}
                                  for r in mine])
            reports.append(Report(kind=kind, frame=frame, records=mine, title=kind))
    return reports
