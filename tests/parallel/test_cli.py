"""Bad `lmperf dist` input: one line and exit 2, before any rank starts."""

from __future__ import annotations

from pathlib import Path

import pytest

import lmperf.questions.parallel
from lmperf.cli import main


@pytest.mark.parametrize("argv", [
    ["comm", "--sizes", "1parsec"], ["comm", "--collective", "gather"],
    ["train", "--strategy", "ring"], ["train", "--world-size", "1", "--strategy", "naive"],
    ["train", "--size", "gigantic"], ["comm", "--world-size", "0"],
    ["train", "--bucket-mb", "0"], ["comm", "--timeout", "-1"],
    ["train", "--strategy", "fsdp"]])
def test_bad_input_is_one_line(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["dist", *argv, "--out", str(tmp_path / "x.jsonl"), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lmperf: error:") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.jsonl").exists()


def test_package_is_callable_and_exports_the_strategies() -> None:
    from lmperf.questions.parallel import DDPBucketed, DDPIndividualParameters, FSDP2, ShardedOptimizer

    assert DDPIndividualParameters is lmperf.questions.parallel.OverlapDDP and DDPBucketed is lmperf.questions.parallel.BucketedDDP
    assert callable(lmperf.dist) and FSDP2.__name__ == "FSDP2" and ShardedOptimizer.__name__ == "ShardedOptimizer"
