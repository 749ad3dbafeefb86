"""Views over parsed traces: per-phase tables, category shares, wall times, attention breakdown."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from lmperf.questions.profile import views
from lmperf.questions.profile.classify import CATEGORIES, classify
from lmperf.questions.profile.from_trace import category_table
from lmperf.questions.profile.overlap import breakdown
from lmperf.questions.profile.annotate import ATTENTION_RANGES, FINAL_MATMUL, SCORES, SOFTMAX
from lmperf.questions.profile.trace import load_trace
from tests.profile.test_trace import LAYERS, STEPS, _variant, cpu_trace_file, real_trace

PHASES = ["forward", "loss", "backward", "optimizer", "step"]


def toy_classify(name: str) -> str:
    """A stand-in for the real classifier: enough to split matmuls from the rest."""
    return "matmul" if ("mm" in name or "gemm" in name) else "other"


@pytest.fixture(scope="module")
def cpu():
    return load_trace(cpu_trace_file())


@pytest.fixture(scope="module")
def cuda():
    return real_trace()  # V100, DDP + SGD, 5 steps (see data/README.md)


@pytest.mark.parametrize("phase", PHASES)
def test_shares_sum_to_one_per_phase(cpu, cuda, phase):
    for trace in (cpu, cuda):
        table = views.phase_table(trace, phase, top=None)
        if trace is cuda and phase == "loss":  # the DDP program has no loss range
            assert table.empty and views.phase_total_ms(trace, phase) == 0
            continue
        assert table["share"].sum() == pytest.approx(1.0)
        assert table["total_ms"].sum() == pytest.approx(views.phase_total_ms(trace, phase))


def test_phase_total_is_the_self_time_of_its_ops(cpu):
    ops = cpu.ops
    fwd = ops.loc[ops["phase"] == "forward", "self_us"].sum() / 1e3
    assert views.phase_total_ms(cpu, "forward") == pytest.approx(fwd)
    step = views.phase_total_ms(cpu, "step")
    parts = sum(views.phase_total_ms(cpu, p) for p in ("forward", "backward", "optimizer"))
    assert step == pytest.approx(parts)  # a train step's ops all lie in one of its phases
    # op time is inside the ranges' wall time (Python between ops is not op time)
    walls = views.phase_wall_times(cpu)
    assert views.phase_total_ms(cpu, "forward") <= walls.loc[walls["phase"] == "forward", "ms"].sum()


def test_top_n_truncation_keeps_full_table_shares(cpu):
    full = views.phase_table(cpu, "backward", top=None)
    top = views.phase_table(cpu, "backward", top=3)
    assert len(top) == 3 and len(full) > 3
    pd.testing.assert_frame_equal(top, full.head(3))
    assert top["share"].sum() < 1.0
    assert list(full["total_ms"]) == sorted(full["total_ms"], reverse=True)
    assert top.attrs["phase_total_ms"] == pytest.approx(full["total_ms"].sum())


def test_table_columns_and_calls_per_step(cpu):
    table = views.phase_table(cpu, "forward", top=None, classify=toy_classify)
    assert list(table.columns) == ["name", "category", "calls_per_step", "total_ms", "ms_per_step",
                                   "avg_us", "share"]
    row = table.set_index("name").loc["aten::exp"]
    assert row["calls_per_step"] == LAYERS  # one exp per naive softmax (cross-entropy has none)
    assert row["ms_per_step"] == pytest.approx(row["total_ms"] / STEPS)
    assert row["avg_us"] == pytest.approx(row["total_ms"] * 1e3 / (LAYERS * STEPS))
    assert table.set_index("name").loc["aten::mm", "category"] == "matmul"


def test_category_shares_and_matmul_share(cpu, cuda):
    for trace in (cpu, cuda):
        shares = category_table(trace, ["forward", "step"])
        assert set(shares["category"]) <= set(CATEGORIES)
        assert shares[["forward", "step"]].sum().tolist() == pytest.approx([1.0, 1.0])
        assert 0.0 < shares.set_index("category").loc["matmul", "step"] < 1.0
    # the real CUDA trace: device time of the kernels classified as matmul, by launch
    k = cuda.kernels
    shares = category_table(cuda, ["backward", "step"]).set_index("category")
    for phase, mask in (("step", k["in_step"]), ("backward", k["phase"] == "backward")):
        mm = k[mask & k["name"].map(classify).eq("matmul")]["dur_us"].sum()
        assert shares.loc["matmul", phase] == pytest.approx(mm / k[mask]["dur_us"].sum())


def test_cuda_tables_count_kernels_by_launch(cuda):
    k = cuda.kernels
    bwd = views.phase_table(cuda, "backward", top=None)
    assert bwd["total_ms"].sum() == pytest.approx(k.loc[k["phase"] == "backward", "dur_us"].sum() / 1e3)
    assert bwd.attrs["kind"] == "kernels"
    top = bwd.iloc[0]  # per step: calls and time over the 5 steps
    same = k[(k["phase"] == "backward") & (k["name"] == top["name"])]
    assert top["calls_per_step"] == len(same) / 5
    assert top["ms_per_step"] == pytest.approx(same["dur_us"].sum() / 1e3 / 5)
    step = views.phase_table(cuda, "step", top=None)
    assert step["total_ms"].sum() == pytest.approx(k["dur_us"].sum() / 1e3)  # all attributed
    # the CPU view of the same trace is still available, autograd's thread included
    ops = views.phase_table(cuda, "backward", kind="ops", top=None)
    o = cuda.ops[cuda.ops["phase"] == "backward"]
    assert ops["total_ms"].sum() == pytest.approx(o["self_us"].sum() / 1e3)
    assert ops["name"].str.startswith("autograd::engine::evaluate_function").any()


def test_phase_wall_times_per_step(cpu):
    walls = views.phase_wall_times(cpu)
    assert list(walls.columns) == ["step", "phase", "ms"]
    assert len(walls) == STEPS * 5
    assert walls["phase"].tolist()[:5] == ["step", "forward", "loss", "backward", "optimizer"]
    wide = walls.pivot(index="step", columns="phase", values="ms")
    assert wide.index.tolist() == list(range(STEPS))
    fwd = cpu.ranges[(cpu.ranges["name"] == "forward")].sort_values("step")
    assert wide["forward"].tolist() == pytest.approx((fwd["dur_us"] / 1e3).tolist())
    assert (wide[["forward", "backward", "optimizer"]].sum(axis=1) <= wide["step"]).all()


def test_phase_wall_times_device_timeline(cuda):
    host = views.phase_wall_times(cuda).set_index(["step", "phase"])["ms"]
    dev = breakdown(cuda, phases=True).set_index(["step", "phase"])["span_ms"]
    r = cuda.ranges
    first_bwd = r[(r["name"] == "## backward ##") & ~r["on_device"]].sort_values("start_us").iloc[0]
    assert host[(0, "backward")] == pytest.approx(first_bwd["dur_us"] / 1e3)  # "## backward ##"
    assert host[(0, "step")] == pytest.approx(  # no `step` range: the ProfilerStep#
        r.loc[r["name"] == "ProfilerStep#101", "dur_us"].iloc[0] / 1e3)
    k = cuda.kernels
    k = k[(k["step"] == 0) & (k["phase"] == "backward")]
    # first to last backward activity on the device (float64: epoch starts to 0.25 us)
    assert dev[(0, "backward")] == pytest.approx((k["end_us"].max() - k["start_us"].min()) / 1e3,
                                                 abs=5e-4)
    assert dev[(0, "backward")] > host[(0, "backward")]  # the device lags the host


def test_attention_breakdown_cpu(cpu):
    flops = {SCORES: {"analytic": 4.0e6}, SOFTMAX: {"analytic": 0.1e6},
             FINAL_MATMUL: {"analytic": 4.0e6}}
    b = views.attention_breakdown(cpu, flops=flops)
    assert b["range"].tolist() == list(ATTENTION_RANGES)
    assert (b["calls_per_step"] == LAYERS).all()
    assert b["share"].sum() == pytest.approx(1.0)
    assert b["flop_analytic_share"].sum() == pytest.approx(1.0)
    r = cpu.ranges
    softmax_ms = r.loc[r["name"] == SOFTMAX, "dur_us"].sum() / 1e3 / STEPS
    row = b.set_index("range").loc[SOFTMAX]
    assert row["ms_per_step"] == pytest.approx(softmax_ms)
    assert row["gflop_per_s_analytic"] == pytest.approx(0.1e6 / (softmax_ms * 1e-3) / 1e9)
    assert row["time_per_flop_share_analytic"] == pytest.approx(
        row["share"] / row["flop_analytic_share"])


def test_attention_breakdown_with_analytic_and_counted_flops(cpu):
    flops = {SCORES: {"analytic": 4.0e6, "counted": 4.0e6}, SOFTMAX: {"analytic": 0.1e6, "counted": 0},
             FINAL_MATMUL: {"analytic": 4.0e6, "counted": 4.0e6}}
    b = views.attention_breakdown(cpu, flops).set_index("range")
    assert b.loc[SOFTMAX, "flops_per_step_counted"] == 0 and b.loc[SOFTMAX, "flop_counted_share"] == 0
    assert b.loc[SOFTMAX, "time_per_flop_share_counted"] == float("inf")
    assert b["flop_analytic_share"].sum() == pytest.approx(1.0)


def test_attention_breakdown_empty_without_subranges(cpu):
    plain = dataclasses.replace(cpu, ranges=cpu.ranges[~cpu.ranges["name"].isin(ATTENTION_RANGES)])
    assert views.attention_breakdown(plain, {SOFTMAX: {"analytic": 1.0}}).empty


def test_attention_breakdown_cuda_uses_kernel_time(tmp_path, cuda):
    """A "computing softmax" range around the first kernel launch of each forward: the
    breakdown is that kernel's device time, not the (short) host range."""
    k = cuda.kernels
    first = k[k["phase"] == "forward"].sort_values("launch_us").groupby("step").head(1)
    wanted = set(first["correlation"].astype(int))

    def edit(doc):
        launches = [e for e in doc["traceEvents"] if e.get("cat") == "cuda_runtime"
                    and e["args"].get("correlation") in wanted]
        doc["traceEvents"] += [{"ph": "X", "cat": "user_annotation", "name": SOFTMAX,
                                "pid": e["pid"], "tid": e["tid"], "ts": e["ts"], "dur": e["dur"]}
                               for e in launches]

    t = _variant(tmp_path, edit, "softmax.json")
    b = views.attention_breakdown(t).set_index("range")
    assert b.attrs["kind"] == "kernels"
    assert b.loc[SOFTMAX, "ms_per_step"] == pytest.approx(first["dur_us"].sum() / 1e3 / 5)
    assert b.loc[SOFTMAX, "calls_per_step"] == 1
    assert b.loc[SOFTMAX, "share"] == 1.0 and b.loc[SCORES, "calls_per_step"] == 0
