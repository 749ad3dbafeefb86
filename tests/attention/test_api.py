"""`lmperf.attention(...)`: the package is the API function, and it returns a Report."""

from __future__ import annotations

import pandas as pd

import lmperf
from lmperf.core.report import Report


def test_the_issue_s_call_returns_a_report_with_a_numeric_frame():
    report = lmperf.attention(attention=["naive", "sdpa"], context=[256])
    assert isinstance(report, Report) and report.kind == "attention"
    df = report.frame
    assert isinstance(df, pd.DataFrame)
    assert list(df["attention"]) == ["naive", "sdpa"] and list(df["context"]) == [256, 256]
    assert (df["status"] == "ok").all(), df["message"].tolist()
    for col in ("forward_ms", "backward_ms", "end_to_end_ms", "before_backward_mib",
                "x_score_matrix", "speedup_vs_naive"):
        assert pd.api.types.is_float_dtype(df[col]) and df[col].notna().all(), col
    assert df.loc[0, "speedup_vs_naive"] == 1.0
    assert "memory before backward, MiB (inputs excluded)" in report.tables
    assert report.headline[0].startswith("fastest fwd+bwd at context 256: ")
    assert len(report.records) == 2


def test_scalars_inline_and_plots(tmp_path):
    report = lmperf.attention("naive", context=16, d=8, dtype="fp32", warmup=0, steps=1,
                              inline=True, plots=tmp_path)
    assert report.frame["status"].tolist() == ["ok"]
    assert (tmp_path / "latency_vs_seq.png").exists()
    assert lmperf.attention.__module__ == "lmperf.questions.attention.api"
