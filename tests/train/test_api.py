"""`lmperf.train(...)`: the package is callable and returns a Report (records kept in memory)."""

from __future__ import annotations

import pandas as pd

import lmperf
from lmperf.core.report import Report


def test_train_returns_a_report_with_one_row_per_regime(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # out=None: nothing may be written
    report = lmperf.train(steps=5, precision=["fp32"], inline=True)
    assert isinstance(report, Report) and report.kind == "train"
    assert isinstance(report.frame, pd.DataFrame) and len(report.frame) == 1
    row = report.frame.iloc[0]
    assert (row["precision"], row["status"], row["outcome"], row["steps_run"]) == (
        "fp32", "ok", "completed", 5)
    assert row["final_loss"] < row["first_loss"]
    assert list(report.table("validation loss per step")["step"]) == [0, 5]
    assert len(report.records) == 1 and report.records[0]["spec"]["lr_warmup"] == 20
    assert "fp32" in report.render("text") and not list(tmp_path.iterdir())


def test_compile_trains_the_compiled_model_with_compile_time_apart():
    import lmperf

    report = lmperf.train(steps=3, precision=["fp32"], compile=[False, True], inline=True,
                          eval_interval=3, eval_batches=1)
    plain, compiled = report.records
    assert (plain["status"], compiled["status"]) == ("ok", "ok")
    assert plain["metrics"]["summary"]["compile_s"] is None
    assert compiled["metrics"]["summary"]["compile_s"] > 0
    assert list(report.frame["precision"]) == ["fp32", "fp32 (compiled)"]


def test_float8_trains_beside_its_bf16_regime_and_is_read_against_it():
    """`lmperf train --precision bf16-mixed --float8 none rowwise`: the same seed and batches,
    the float8 curve beside bf16-mixed's and its ending read against it (where float8 runs)."""
    import pytest
    import torch

    from lmperf.runtime.device import float8_unsupported_reason

    if (why := float8_unsupported_reason(torch.device("cpu"), "rowwise")) is not None:
        pytest.skip(why)
    report = lmperf.train(steps=3, precision=["fp32", "bf16-mixed"], float8=["none", "rowwise"],
                          inline=True, eval_interval=3, eval_batches=1)
    assert list(report.frame["precision"]) == ["fp32", "bf16-mixed",
                                               "bf16-mixed + float8 rowwise"]
    assert (report.frame["status"] == "ok").all()
    assert list(report.table("validation loss per step").columns)[-1] == \
        "bf16-mixed + float8 rowwise"
    assert any(f.startswith("bf16-mixed + float8 rowwise ends at validation loss")
               and "against bf16-mixed's" in f for f in report.findings)
