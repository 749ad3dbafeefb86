"""The memory Report from records alone: the API, `lmperf table` in every format, job specs,
job-level failures."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd
import pytest

import lmperf
from lmperf.cli import main
from lmperf.core.launch import failed_record
from lmperf.core.report import Report
from lmperf.questions.memory.api import memory
from lmperf.questions.memory.plan import plan_memory as _plan_memory
from lmperf.questions.memory.report import build_report
from lmperf.questions.memory.spec import MemorySpec
from tests.fixtures.defaults import with_api_defaults


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> tuple[Report, Path]:
    """One inline run of the API (phases + saved, warm-up 0) and an estimate, in one file."""
    out = tmp_path_factory.mktemp("memory") / "memory.jsonl"
    plots = out.parent / "plots"
    report = lmperf.memory(size="tiny", context=[32, 64], inline=True, warmup=0, out=out,
                           plots=plots)
    lmperf.memory(size="tiny", context=[64], estimate=True, gib=1.0, out=out)
    return report, out


def test_api_returns_a_report_with_a_numeric_frame(results):
    report, out = results
    assert isinstance(report, Report) and report.kind == "memory"
    frame = report.frame
    assert isinstance(frame, pd.DataFrame) and len(frame) == 6  # 2 contexts x 2 modes + 2 saved
    assert set(frame["analysis"]) == {"phases", "saved"} and (frame["status"] == "ok").all()
    phases = frame[frame["analysis"] == "phases"]
    assert pd.api.types.is_float_dtype(phases["peak_mib"]) and (phases["peak_mib"] > 0).all()
    assert (frame["warmup"] == 0).all()  # warmup=0 is recorded as given
    assert any(f.startswith("plot: ") for f in report.findings)
    assert (out.parent / "plots" / "memory_vs_context.png").stat().st_size > 0
    assert "peak memory per phase (MiB)" in report.tables


@pytest.mark.parametrize("fmt", ["latex", "csv", "markdown"])
def test_table_renders_a_results_file(results, fmt, capsys):
    _, out = results
    assert main(["table", str(out), "--kind", "memory", "--format", fmt]) == 0
    text = capsys.readouterr().out
    if fmt == "csv":
        df = pd.read_csv(io.StringIO(text))
        # 6 measured rows + the estimate's 2 (one simulated step per mode: forward, train-step)
        assert len(df) == 8 and {"analysis", "context", "peak_mib", "estimate_bytes"} <= set(df.columns)
    elif fmt == "latex":
        assert "\\begin{tabular}" in text and "2 of 2 fit in 1 GiB" in text
        assert " & fits \\\\" in text  # the verdict is a column of the estimate's table
    else:
        assert "#### peak memory per step" in text and "fp32 train-step |" in text


def test_report_from_records_equals_the_run(results):
    report, _ = results
    again = build_report(report.records)
    assert list(again.tables) == list(report.tables) and again.findings[:3] == report.findings[:3]
    pd.testing.assert_frame_equal(again.frame, report.frame)


def plan_memory(**options):
    """plan_memory with lmperf.memory's defaults for the keywords not given (it has none)."""
    return with_api_defaults(_plan_memory, memory, **options)


def test_job_spec_round_trip_and_label():
    plan = plan_memory(size="tiny", context=[16, 32], precision=["fp32"], device="cpu")
    assert [j.analysis for j in plan.jobs] == ["phases", "saved"]
    job = plan.jobs[0]
    assert MemorySpec.from_dict(json.loads(json.dumps(job.to_dict()))) == job
    assert job.run.context == 32 and job.contexts == (16, 32) and job.threads == 1
    assert job.label() == "phases tiny fp32 b=4 ctx 16,32"


def test_a_dead_job_is_one_error_row_in_the_report():
    job = plan_memory(size="tiny", context=[16, 32], device="cpu").jobs[0]
    record = failed_record(job, "error", "the child process died with SIGKILL")
    report = build_report([record])
    assert len(report.frame) == 1 and report.frame["status"].iloc[0] == "error"
    assert any("phases job (fp32, contexts 16, 32): error" in f for f in report.findings)
    assert "SIGKILL" in report.render("text") and len(pd.read_csv(io.StringIO(report.render("csv"))))


def test_records_written_before_jobs_still_render(results):
    """Older records: no job_id, no per-group rows or T x T bytes in 'saved', 'message' kept
    among the metrics, no threads or clip in the spec."""
    report, _ = results
    old = []
    for r in json.loads(json.dumps(report.records)):
        r.pop("job_id")
        for key in ("threads", "clip"):
            r["spec"].pop(key)
        if r["spec"]["analysis"] == "saved":
            for key in ("groups", "square_bytes"):
                r["metrics"]["saved"].pop(key)
        else:
            r["metrics"]["message"] = ""
        old.append(r)
    rebuilt = build_report(old)
    assert list(rebuilt.tables) == list(report.tables)
    assert rebuilt.frame["estimate_bytes"].notna().all()
    assert list(rebuilt.tables["saved for backward per group: fp32, context 64"].columns) == \
        ["group", "activations MiB"]


def test_progress_lines_name_the_cell_and_its_figure(results):
    from lmperf.questions.memory.report import summary_line

    report, _ = results
    lines = [summary_line(r) for r in report.records]
    assert lines[0].startswith("context 32 forward: peak ") and lines[0].endswith(" MiB")
    assert lines[-1].startswith("context 64 train-step: ") and "saved for backward" in lines[-1]
