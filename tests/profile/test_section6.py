"""Issue 21 §6, as far as `lmperf profile` goes: a profiler "overhead" within the run's noise
says so; the loss and convolutions have their own categories; share columns are fractions in
the tables and percent when rendered, as the findings write them."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from lmperf.core.report import Report, is_share, readable
from lmperf.questions.profile.from_trace import CATEGORY_TABLE, analyse_trace
from lmperf.questions.profile.report import build_report, overhead_within_noise

V100 = Path(__file__).parent / "data" / "v100_ddp_sgd_5steps.json.gz"


def test_overhead_within_noise():
    noisy = [10.0, 14.0, 9.0, 13.0, 11.0, 15.0, 8.0, 12.0]  # mean 11.5, sd ~2.4
    assert overhead_within_noise(noisy, [x * 0.92 for x in noisy]) is True  # "-8%" is noise
    steady = [10.0, 10.1, 9.9, 10.0, 10.05, 9.95]
    assert overhead_within_noise(steady, [x * 1.08 for x in steady]) is False  # +8% is real
    assert overhead_within_noise([10.0], [11.0, 12.0]) is None  # no spread to judge by


def test_profile_display_marks_noise():
    samples = {"benchmarked": {"step": [10.0, 14.0, 9.0, 13.0, 11.0, 15.0]},
               "profiled": {"step": [9.2, 12.9, 8.3, 12.0, 10.1, 13.8]}}
    record = {"schema": 1, "kind": "profile", "status": "ok", "spec": {"size": "tiny"},
              "metrics": {"samples_ms": samples}}
    text = build_report([record]).render("text")
    assert "-7.9% (noise)" in text


def test_loss_and_convolutions_have_categories():
    report = analyse_trace(V100, top=3)
    cats = report.tables[CATEGORY_TABLE].set_index("category")
    # The V100 trace is a ResNet-style DDP job: cuDNN convolutions, nothing "other" about them.
    assert cats.loc["convolution", "step"] > 0.3
    assert cats.loc["other", "step"] < 0.1
    top = report.tables["top operators (self time): backward"]
    assert top.iloc[0]["name"] == "aten::convolution_backward"
    assert top.iloc[0]["category"] == "convolution"


def test_shares_are_fractions_in_tables_and_percent_when_rendered():
    report = analyse_trace(V100, top=3)
    phases = report.tables["time per phase (ms per step, mean over the steps)"]
    step = phases.set_index("phase").loc["step", "gpu_busy_share"]
    assert step == pytest.approx(1.0)  # a fraction in the table
    assert report.frame["gpu_idle_share"].between(0, 1).all()
    text = report.render("text")
    assert "100.0%" in text
    assert is_share("share") and is_share("gpu_idle_share") and not is_share("shares_ms")
    shown = readable(pd.DataFrame({"share": [0.125, float("nan")], "ms": [1.0, 2.0]}))
    assert list(shown["share"]) == ["12.5%", "-"] and list(shown["ms"]) == ["1", "2"]
    assert isinstance(report, Report)
