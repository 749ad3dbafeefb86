"""The Report of profile records, rebuilt from records alone: numeric frame and tables, labels
when there are several, and records written before the tables were numeric (a real file)."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pandas as pd

from lmperf.questions.profile.report import PHASE_TIMES, build_report, stored_table
from lmperf.results.store import read_records

V0 = Path(__file__).parent / "data" / "profile_records_v0.jsonl"  # written by lmperf at dc80591


def test_older_records_become_numeric_tables():
    report = build_report(read_records(V0))
    assert list(report.frame["mode"]) == ["train-step", "forward"]
    assert list(report.frame["status"]) == ["ok", "ok"]
    # "33.20 ± 42.10" in the stored phase table is the first row's benchmarked forward time
    assert report.frame["forward_ms_mean"].iloc[0] == 33.20
    assert report.frame["forward_ms_std"].iloc[0] == 42.10
    assert math.isnan(report.frame["backward_ms_mean"].iloc[1])  # forward mode: no backward
    label = "tiny ctx=32 b=2 fp32 train-step naive"
    phases = report.tables[f"{label}: {PHASE_TIMES}"]
    assert phases.set_index("phase").loc["backward", "overhead_pct"] == 3.2  # was "+3.2%"
    assert all(phases[c].dtype.kind == "f" for c in phases.columns if c != "phase")
    side = report.tables[f"{label}: forward vs whole step (top entries side by side)"]
    assert list(side.columns[:3]) == ["rank", "forward name", "forward category"]
    assert all(f.startswith("tiny ctx=32 b=2 fp32 ") for f in report.findings)


def test_one_record_keeps_its_titles_and_csv_is_the_frame():
    (record, _) = read_records(V0)
    report = build_report([record])
    assert PHASE_TIMES in report.tables and not report.findings[0].startswith("tiny")
    df = pd.read_csv(io.StringIO(report.render("csv")))
    assert len(df) == 1 and df["step_ms_mean"].iloc[0] == 39.69


def test_failed_rows_have_status_and_message_and_no_numbers():
    (record, _) = read_records(V0)
    failed = {**record, "status": "error", "message": "RuntimeError while profiling 2 steps: x",
              "metrics": None}
    report = build_report([record, failed])
    assert list(report.frame["status"]) == ["ok", "error"]
    assert math.isnan(report.frame["step_ms_mean"].iloc[1])
    text = report.render("text")
    assert "error [1]" in text and "[1] error: RuntimeError while profiling 2 steps: x" in text
    # the same run twice: the tables of each are told apart
    assert any(t.startswith("tiny ctx=32 b=2 fp32 train-step naive #1: ") for t in report.tables)


def test_json_non_finite_strings_are_floats_again():
    df = stored_table("attention", [{"range": "softmax", "ratio": "inf", "x": 1.0},
                                    {"range": "scores", "ratio": 0.5, "x": "nan"}])
    assert df["ratio"].tolist() == [math.inf, 0.5] and math.isnan(df["x"].iloc[1])
    assert df["range"].tolist() == ["softmax", "scores"]
