"""The Report of attention records: numeric frame, speedup matched per sweep, no-run groups."""

from __future__ import annotations

import math

import pandas as pd

from lmperf.questions.attention.report import build_report
from lmperf.questions.attention.spec import AttnSpec


def _record(attention: str, context: int, ms: float | None, status: str = "ok") -> dict:
    spec = AttnSpec(attention, context=context, d=16).to_dict()
    metrics = {"analytic": {"score_matrix_mib": context * context * 4 / 2**20}}
    if status == "ok":
        summary = {"median": ms, "n": 2}
        metrics.update({f"{p}_ms": summary for p in ("forward", "backward", "end_to_end")},
                       memory={"before_backward_mib": 1.0, "x_score_matrix": 2.0})
    return {"kind": "attention", "status": status, "spec": spec, "metrics": metrics,
            "message": "" if status == "ok" else "out of memory while timing the forward",
            "env": {"device_name": "cpu"}}


def test_each_row_is_compared_with_its_own_sweep_s_naive():
    # two sweeps of the same shape appended to one file: 4 ms / 2 ms, then 10 ms / 1 ms
    records = [_record("naive", 64, 4.0), _record("sdpa", 64, 2.0),
               _record("naive", 64, 10.0), _record("sdpa", 64, 1.0)]
    df = build_report(records).frame
    assert df["speedup_vs_naive"].tolist() == [1.0, 2.0, 1.0, 10.0]


def test_failed_rows_are_nan_and_numbered_in_the_rendered_table():
    report = build_report([_record("naive", 64, 4.0), _record("naive", 8192, None, "oom")])
    df = report.frame
    assert pd.api.types.is_float_dtype(df["end_to_end_ms"]) and math.isnan(df.at[1, "end_to_end_ms"])
    for table in report.tables.values():  # numeric: no status strings in the cells
        assert all(pd.api.types.is_numeric_dtype(t) for t in table.dtypes)
    text = report.render("text")
    assert "oom [1]" in text and "[1] oom: out of memory while timing the forward" in text


def test_a_shape_where_nothing_ran_has_no_tables_but_a_row():
    report = build_report([_record("naive", 8192, None, "oom")])
    assert report.tables == {} and report.frame["status"].tolist() == ["oom"]
    assert "oom [1]" in report.render("markdown")
