"""`bench --predict` at 120 columns (issue 43): the answer first, and the step time is never the
column cut (it was: the table of two devices lost `step (s)`, keeping six constant columns)."""

from __future__ import annotations

import re

from lmperf.cli import main


def test_predict_opens_with_the_step_time_and_keeps_its_column(tmp_path, capsys):
    assert main(["bench", "--predict", "H100", "A100-80GB", "--size", "tiny", "--context", "32",
                 "--out", str(tmp_path / "p.jsonl")]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("PREDICTED step time (size tiny, context 32, batch 4, ")
    assert re.search(r"H100-SXM [\d.]+ ms \(ideal [\d.]+ ms\)", " ".join(out.split()[:40]))
    head = next(line for line in lines if line.startswith("size "))
    assert "step (s)" in head and "fits" in head and "context" not in head.split("  ")
    assert "context 32, batch 4, precision fp32" in out  # the constant columns: under the table
    assert max(map(len, lines)) <= 120
