"""`lmperf compare --json FILE` in the write-up: its rows (kind 'compare', one 'table' field
each: 'phases', 'throughput and memory', 'not compared') back into a section of tables.

The rows are a comparison, not runs: they carry no status, environment or findings, so the
section shows the tables as compare computed them and says where the verdict lines are."""

from __future__ import annotations

import pandas as pd

from lmperf.questions.writeup.sections import (DERIVED, MAX_ROWS, STATUSES, Section, Table,
                                               readable_table)

# compare's own figures (never moved into the caption, even when equal in every row)
FIGURES: frozenset[str] = frozenset({
    "phase", "base_n", "new_n", "base_median_ms", "new_median_ms", "ratio", "ci_low", "ci_high",
    "change_pct", "verdict", "base_load_per_cpu", "new_load_per_cpu"})
SPEC_LIKE: frozenset[str] = frozenset({"record_kind"})


def compare_section(rows: list[dict]) -> Section:
    """The write-up Section of compare's JSON rows: one table per 'table' value, 'phases' first
    (numbers as written: ratio NEW/BASE, CI, change %, verdict per matched spec and phase)."""
    names = list(dict.fromkeys(["phases"] + [str(r.get("table")) for r in rows]))
    tables = []
    for name in names:
        mine = [{k: v for k, v in r.items() if k not in ("kind", "table")}
                for r in rows if r.get("table") == name]
        if mine:
            title = "phases: NEW / BASE per matched spec" if name == "phases" else name
            df = pd.DataFrame(mine)
            # spec fields equal in every row say which runs were compared, not how they differ:
            # into the caption, so the table keeps to what varies and to compare's figures
            same = [c for c in df.columns if c in SPEC_LIKE or c not in FIGURES
                    if len(df) > 1 and df[c].fillna("-").astype(str).nunique() == 1]
            caption = "; ".join(f"{c} {df[c].fillna('-').iloc[0]}" for c in same)
            # a preset's shape fields follow from its size: the size column names them
            derived = [c for c in df.columns if c in DERIVED and "size" in df.columns]
            shown = df.drop(columns=same + derived)
            shown.columns = [c.replace("_", " ") for c in shown.columns]  # headers may wrap
            tables.append(readable_table(title, shown, caption, max_rows=MAX_ROWS))
    verdicts = pd.Series([r.get("verdict") for r in rows if r.get("table") == "phases"])
    counts = ", ".join(f"{n} {v}" for v, n in verdicts.value_counts().items() if v)
    findings = [f"{len(verdicts)} phase comparison(s): {counts}"] if counts else []
    empty = Table("environment", pd.DataFrame())  # empty tables are not rendered
    return Section(kind="compare", title="lmperf compare", counts=dict.fromkeys(STATUSES, 0),
                   tables=tables,
                   findings=findings, failures=empty, warnings=empty, environment=empty,
                   notes=[f"{len(rows)} row(s) of `lmperf compare --json`: a comparison, not "
                          "runs (no status or environment of its own; the records it compared "
                          "have them); `lmperf compare` prints its verdict lines"])
