"""Runs that differ only in checkpointing or accumulation are different runs: bench's table shows
what tells them apart and its ratios hold each run against its own setting's fp32 (records of
`lmperf bench --size tiny --context 64 --batch 2 --precision fp32 bf16-mixed --checkpoint 0 1
--steps 3 --warmup 1`, this project's 2-core EPYC, 2026-11-28, read back with issue 41's names:
none and full); `--predict` refuses what it does not price."""

from __future__ import annotations

from pathlib import Path

import pytest

import lmperf
from lmperf.errors import SpecError
from lmperf.questions.bench.report import build_report
from lmperf.results.store import read_records

RECORDS = read_records(Path(__file__).parent / "data" / "tiny_checkpoint_0_1.jsonl")


def test_each_checkpoint_setting_is_its_own_row_and_ratio():
    report = build_report(RECORDS)
    steps = {(r["spec"]["precision"], r["spec"]["checkpoint"]): r["metrics"]["step_ms"]["median"]
             for r in RECORDS}
    (table,) = [t for name, t in report.tables.items() if name.startswith("precision:")]
    got = sorted(table["step (x fp32)"].round(6))
    want = sorted(round(steps["bf16-mixed", c] / steps["fp32", c], 6) for c in ("none", "full"))
    assert got == want  # each against its own checkpointing's fp32, never across
    header = next(l for l in report.render("text").splitlines() if l.startswith("size "))
    assert "checkpoint" in header  # a column of the table


def test_predict_refuses_what_it_does_not_price():
    for extra in ({"checkpoint": 1}, {"checkpoint": ["none", "op"]}, {"grad_accum": 4},
                  {"float8": "rowwise"}):
        with pytest.raises(SpecError, match="lmperf plan"):
            lmperf.bench(size="tiny", predict=["H100-SXM"], **extra)


def test_checkpointing_a_forward_is_refused_in_one_line():
    with pytest.raises(SpecError, match="saves memory for backward"):
        lmperf.bench(size="tiny", mode="forward", checkpoint=1)


def test_a_sweep_of_modes_runs_the_forward_without_checkpointing():
    from lmperf.workload.spec import Grid

    specs = Grid(["tiny"], [64], [2], ["fp32"], ["forward", "train-step"], ["naive"],
                 checkpoints=(0, "full")).expand()
    assert [(s.mode, s.checkpoint) for s in specs] == [("forward", "none"),
                                                       ("train-step", "none"),
                                                       ("train-step", "full")]


def test_a_sweep_of_regimes_runs_fp32_without_float8():
    from lmperf.workload.spec import Grid

    specs = Grid(["tiny"], [64], [2], ["fp32", "bf16-mixed"], ["train-step"], ["naive"],
                 float8s=("none", "rowwise")).expand()
    assert [(s.precision, s.float8) for s in specs] == [("fp32", "none"), ("bf16-mixed", "none"),
                                                        ("bf16-mixed", "rowwise")]
    with pytest.raises(SpecError, match="trains beside a bf16 regime"):
        Grid(["tiny"], [64], [2], ["fp32"], ["train-step"], ["naive"],
             float8s=("rowwise",)).expand()
