"""Issue 43: a plan where nothing fits says on how many GPUs it would, and that plan fits."""

from __future__ import annotations

import re

import pytest

from lmperf.cli import main


@pytest.mark.slow
def test_nothing_fits_names_the_fewest_gpus_that_do(capsys, tmp_path):
    argv = ["plan", "--size", "llama3-8b", "--gpu", "H100-SXM", "--context", "8192",
            "--precision", "bf16-mixed", "--checkpoint", "none", "full", "--float8", "none",
            "--out", str(tmp_path / "p.jsonl")]
    assert main([*argv, "--gpus", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("nothing fits: does not fit:")
    line = next(x for x in out.replace("\n  ", " ").splitlines() if x.startswith("it fits on"))
    n = int(re.search(r"it fits on (\d+) GPUs", line).group(1))
    assert n >= 2 and f"--gpus {n}" in line
    assert main([*argv, "--gpus", str(n), "--precision", "bf16-fsdp"]) == 0
    assert capsys.readouterr().out.startswith("winner: ")  # the plan on n GPUs has one
