"""The torch backend on the CPU: the course's questions answered with numeric tables and findings;
the process Nsight Systems runs."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from lmperf.core.outcome import Stage
from lmperf.questions.profile.annotate import ATTENTION_RANGES
from lmperf.questions.profile.report import PHASE_TIMES
from lmperf.questions.profile.job import profile_torch
from lmperf.results.record import stored_table
from lmperf.questions.profile.trace import load_trace
from lmperf.workload.spec import RunSpec

QUICK = dict(context=32, batch=2, warmup=1, steps=3)


@pytest.fixture(scope="module")
def train(tmp_path_factory):
    path = tmp_path_factory.mktemp("prof") / "trace.json"
    stage = Stage()
    fields = profile_torch(RunSpec.from_size("tiny", **QUICK), path, top=5, stage=stage)
    # the stage followed the capture and the analysis to the end (the roofline comes last)
    assert stage.now == "counting FLOPs and bytes per operator (roofline)"
    m = fields["metrics"]
    return SimpleNamespace(tables=[(t, stored_table(t, rows)) for t, rows in m["tables"].items()],
                           notes=m["notes"], timings=m["timings_s"],
                           samples_ms=m["samples_ms"], trace_path=m["trace_path"])


def test_answers_each_question_with_a_table_and_a_finding(train):
    titles = [t for t, _ in train.tables]
    assert titles[0].startswith("phase times")
    for phase in ("forward", "backward", "optimizer", "step"):
        assert f"top operators (self time): {phase}" in titles
    assert "share of each phase by category" in titles
    assert "attention: runtime vs FLOPs per forward step" in titles
    for q in ("(a)", "(b)", "(c)", "(d)", "(e)"):
        assert any(n.startswith(q) for n in train.notes), q
    # where the step waits comes first; a CPU run has no device to wait for (issue 34)
    assert train.notes[0].startswith("No GPU in this run: the whole step is the host's")
    assert not any(t.startswith("where the step waits") for t in titles)


def test_the_roofline_tables_follow_from_their_numbers(train):
    from lmperf.questions.profile import roofline

    tables = dict(train.tables)
    ops, phases = tables[roofline.PER_OP], tables[roofline.PER_PHASE]
    assert set(ops["phase"]) == {"forward", "backward", "optimizer"}
    counted = ops[ops["ideal_ms"] > 0]
    one_op, rollup = counted[counted["bound"] != "-"], counted[counted["bound"] == "-"]
    # an op's ideal is the larger of its two bounds; an "(N other ops)" row sums its ops' ideals,
    # which is at least the larger of its summed bounds (which ops fall there depends on timing)
    assert (one_op["ideal_ms"] == one_op[["compute_ms", "memory_ms"]].max(axis=1)).all()
    assert (rollup["ideal_ms"] >= rollup[["compute_ms", "memory_ms"]].max(axis=1) * (1 - 1e-12)).all()
    for r in counted.itertuples():  # each label is read off its row
        if r.bound != "-":
            assert r.bound == roofline.label(r.compute_ms, r.memory_ms, r.measured_ms)
    mm = ops[(ops["op"] == "aten::mm") & (ops["phase"] == "forward")].iloc[0]
    assert mm["gflop"] > 0 and mm["bound"] in ("compute-bound", "memory-bound", "overhead-bound")
    step = phases.set_index("phase").loc["step"]
    assert step["ideal_ms"] == pytest.approx(ops["ideal_ms"].sum())
    assert step["measured_over_ideal"] == pytest.approx(step["measured_ms"] / step["ideal_ms"])
    assert any(n.startswith("Roofline: the step took") for n in train.notes)
    assert "roofline_s" in train.timings


def test_phase_times_are_numbers_of_every_profiled_step(train):
    df = dict(train.tables)[PHASE_TIMES]
    assert list(df["phase"]) == ["forward", "backward", "optimizer", "step"]
    numeric = df.drop(columns="phase")
    assert all(dtype.kind == "f" for dtype in numeric.dtypes)  # numbers, not "12.3 ± 0.5"
    assert not numeric.isna().any().any()  # every phase has a range in the trace
    step = df.set_index("phase").loc["step"]
    assert step["overhead_pct"] == pytest.approx(
        100 * (step["profiled_ms_mean"] / step["benchmarked_ms_mean"] - 1))
    for name in ("benchmarked", "profiled"):
        xs = train.samples_ms[name]["step"]
        assert len(xs) == 3 and step[f"{name}_ms_mean"] == pytest.approx(sum(xs) / 3)


def test_top_tables_are_shares_of_their_phase(train):
    for title, df in train.tables:
        if title.startswith("top operators"):
            assert (df["share"] > 0).all() and df["share"].sum() <= 1.0 + 1e-9
            assert df["share"].is_monotonic_decreasing
            assert len(df) <= 5
    rollup = dict(train.tables)["share of each phase by category"]
    for phase in ("forward", "backward", "optimizer", "step"):
        assert rollup[phase].sum() == pytest.approx(1.0)
    assert rollup.set_index("category").loc["matmul", "forward"] > 0


def test_attention_breakdown_has_three_ranges_with_flops(train):
    df = dict(train.tables)["attention: runtime vs FLOPs per forward step"]
    assert list(df["range"]) == list(ATTENTION_RANGES)
    assert (df["calls_per_step"] == 2).all()  # one per layer of the tiny preset
    flops = df.set_index("range")["flops_per_step_analytic"]
    # B=2, H=4, T=32, D=16, L=2: QK^T is 2*B*H*T*T*D per layer
    assert flops["final matmul"] == 2 * (2 * 2 * 4 * 32 * 32 * 16)


def test_trace_is_a_chrome_trace_of_the_measured_steps_only(train):
    trace = load_trace(train.trace_path)
    assert trace.n_steps == 3
    assert json.loads(Path(train.trace_path).read_text())["traceEvents"]

