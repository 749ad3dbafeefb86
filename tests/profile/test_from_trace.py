"""`lmperf profile --from-trace FILE` and `lmperf.profile(from_trace=...)`: the tables of an existing
torch.profiler trace (the real V100 DDP trace, a real CPU trace of lmperf's step, small traces
written here), what a trace without steps or GPU events says, and bad input as one line."""

from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest

import lmperf
from lmperf.errors import SpecError, TraceFormatError
from lmperf.questions.profile import overlap
from lmperf.questions.profile.from_trace import PHASE_TABLE, analyse_trace
from tests.profile.test_cli import _run
from tests.profile.test_trace import REAL_CUDA, STEPS, cpu_trace_file, real_trace


@pytest.fixture(scope="module")
def cli_real(tmp_path_factory) -> dict:
    """The acceptance command on the real CUDA trace, with CSV tables."""
    csv = tmp_path_factory.mktemp("from-trace") / "csv"
    code, out, err = _run(["profile", "--from-trace", str(REAL_CUDA), "--csv", str(csv)])
    return {"code": code, "stdout": out, "stderr": err, "csv": csv}


def test_cli_prints_per_step_gpu_time_and_top_kernels_per_phase(cli_real):
    assert cli_real["code"] == 0, cli_real["stderr"]
    out = cli_real["stdout"]
    assert "Traceback" not in out + cli_real["stderr"]
    # the answer first (where the step waits, the top of the step), then the tables
    assert out.startswith("device-bound: the GPU was busy 98% of the step (94.49 of 96.01 ms")
    assert "\ntop of the step: " in out
    lines = out.splitlines()
    title = lines.index("lmperf profile --from-trace v100_ddp_sgd_5steps.json.gz "
                        "(recorded on Tesla V100-SXM2-32GB)")
    assert "gpu busy (ms)" in lines[title + 1] and "gpu span (ms)" in lines[title + 1]
    assert "top kernels: step\n" in out and "top operators (self time): step\n" in out
    assert "top kernels: backward\n" not in out  # each phase's top: --details
    assert PHASE_TABLE in out and "share of each phase by category" in out
    details = _run(["profile", "--from-trace", str(REAL_CUDA), "--details"])[1]
    for phase in ("forward", "backward", "optimizer", "step"):
        assert f"top kernels: {phase}\n" in details
        assert f"top operators (self time): {phase}\n" in details
    assert "Volta, fp32 SIMT" in details  # GEMM names decoded
    assert "lmperf: error" not in cli_real["stderr"]
    csvs = sorted(p.name for p in cli_real["csv"].iterdir())
    assert "time_per_step_ms.csv" in csvs and "top_kernels_backward.csv" in csvs
    per_step = pd.read_csv(cli_real["csv"] / "time_per_step_ms.csv")
    assert per_step["profiler_step"].tolist() == [101, 102, 103, 104, 105]


def test_api_report_numbers_come_from_the_trace_layer():
    report = lmperf.profile(from_trace=REAL_CUDA, top=3)
    assert report.kind == "profile" and report.records == []  # no record: see from_trace.py
    trace = real_trace()
    dev = overlap.breakdown(trace, phases=True)
    frame = report.frame.set_index("step")
    steps = dev[dev["phase"] == "step"].set_index("step")
    assert frame["gpu_busy_ms"].tolist() == pytest.approx(steps["busy_ms"].tolist())
    assert frame["gpu_span_ms"].tolist() == pytest.approx(steps["span_ms"].tolist())
    assert (frame["gpu_activities"] == 1219).all()
    r = trace.ranges
    prof = r[r["name"].str.startswith("ProfilerStep#")].sort_values("start_us")
    assert frame["cpu_ms"].tolist() == pytest.approx((prof["dur_us"] / 1e3).tolist())
    phases = report.tables[PHASE_TABLE].set_index("phase")
    assert list(phases.index) == ["forward", "backward", "optimizer", "step"]
    bwd = dev[dev["phase"] == "backward"]
    assert phases.loc["backward", "gpu_busy_ms"] == pytest.approx(bwd["busy_ms"].mean())
    assert phases.loc["step", "gpu_busy_share"] == pytest.approx(1.0)
    top = report.tables["top kernels: backward"]
    assert len(top) == 3 and top["share"].is_monotonic_decreasing
    assert not top["name"].str.contains(r"\(anonymous namespace\)|^void ").any()  # shortened
    assert report.tables["top kernels: optimizer"]["category"].eq("optimizer").all()


def test_cpu_only_trace_says_so_and_prints_operator_tables():
    report = analyse_trace(cpu_trace_file())
    assert any(f.startswith("No GPU activity") for f in report.findings)
    assert not any(t.startswith("top kernels") for t in report.tables)
    assert list(report.frame.columns) == ["step", "profiler_step", "cpu_ms"]
    assert len(report.frame) == STEPS and report.frame["cpu_ms"].gt(0).all()
    phases = report.tables[PHASE_TABLE]
    assert phases["phase"].tolist() == ["forward", "loss (in forward)", "backward", "optimizer", "step"]
    assert "gpu_busy_ms" not in phases.columns
    assert report.tables["top operators (self time): optimizer"]["name"].iloc[0] == "aten::_fused_adamw_"


LMPERF_TRACE = REAL_CUDA.parent / "lmperf_tiny_cpu_2steps.json.gz"


def test_phases_of_lmperfs_own_trace_add_up_to_the_step():
    """`lmperf profile --size tiny` wrote this trace (tests/profile/data/README.md): its loss
    range lies inside forward, so the phases partition the step only with the loss counted once
    (it used to be listed beside forward: phases summed to 108% of the step)."""
    report = analyse_trace(LMPERF_TRACE)
    phases = report.tables[PHASE_TABLE].set_index("phase")
    assert "loss (in forward)" in phases.index  # shown, as a part of forward
    top = phases.drop(index=["step"] + [p for p in phases.index if "(in " in p])
    assert list(top.index) == ["forward", "backward", "optimizer"]
    for col in ("cpu_range_ms", "cpu_ops_ms"):
        assert top[col].sum() == pytest.approx(phases.loc["step", col], rel=0.02)
    assert any("add up to" in f and "loss inside forward, counted once" in f for f in report.findings)


def _write(tmp_path, events, name="t.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def _x(cat, name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def test_trace_without_steps_or_phases_is_one_step_and_says_so(tmp_path):
    path = _write(tmp_path, [_x("cpu_op", "aten::mm", 0, 10), _x("cpu_op", "aten::add", 20, 5)])
    code, out, err = _run(["profile", "--from-trace", str(path)])
    assert code == 0, err
    assert "* No ProfilerStep#N (or step) ranges in t.json: the whole trace is analysed as one step." in out
    assert "* No GPU activity" in out and "* No phase annotations" in out
    assert "top operators (self time): step" in out and "aten::mm" in out


def test_foreign_cuda_trace_without_profiler_steps(tmp_path):
    """A kernel with its launch and an Optimizer.step# range: one step, GPU time, a phase."""
    events = [_x("user_annotation", "Optimizer.step#SGD.step", 0, 50),
              _x("cuda_runtime", "cudaLaunchKernel", 10, 5, correlation=7),
              {**_x("kernel", "multi_tensor_apply_kernel<X>", 100, 20, correlation=7, device=0,
                    stream=7), "pid": 0, "tid": 7}]
    report = analyse_trace(_write(tmp_path, events))
    assert report.frame["gpu_busy_ms"].tolist() == [0.02] and report.frame["step"].tolist() == [0]
    assert report.tables["top kernels: optimizer"]["ms_per_step"].tolist() == [0.02]


@pytest.mark.parametrize("content, fragment", [
    (None, "no trace file at"),
    (b'{"traceEvents": [', "cannot read trace"),
    (b"\x1f\x8b\x08\x00garbage", "cannot read trace"),
    (b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": "soon", "dur": 1}]}',
     "is not a torch.profiler trace"),
    (b'{"traceEvents": [1, 2]}', "is not a torch.profiler trace"),
    (b'{"events": []}', "no 'traceEvents' list"),
])
def test_missing_or_corrupt_file_is_one_line_exit_2(tmp_path, content, fragment):
    path = tmp_path / "bad.json.gz"
    if content is not None:
        path.write_bytes(content)
    code, out, err = _run(["profile", "--from-trace", str(path)])
    assert code == 2 and out == ""
    assert fragment in err and len(err.strip().splitlines()) == 1, err


def test_truncated_gzip_is_one_line(tmp_path):
    path = tmp_path / "cut.json.gz"
    path.write_bytes(REAL_CUDA.read_bytes()[:20000])
    code, _, err = _run(["profile", "--from-trace", str(path)])
    assert code == 2 and "cannot read trace" in err and len(err.strip().splitlines()) == 1


def test_a_directory_is_refused_pointing_at_hta(tmp_path):
    """Many ranks' traces are HTA's (`TraceAnalysis(trace_dir=...)`): lmperf reads one file."""
    (tmp_path / "rank0.json.gz").write_bytes(REAL_CUDA.read_bytes())
    code, out, err = _run(["profile", "--from-trace", str(tmp_path)])
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "reads one trace file" in err and f"TraceAnalysis(trace_dir='{tmp_path}')" in err
    with pytest.raises(TraceFormatError, match="use HTA"):
        lmperf.profile(from_trace=tmp_path)


@pytest.mark.parametrize("extra, fragment", [
    (["--size", "tiny"], "--size"),
    (["--inline"], "--inline"),
    (["--json"], "--json prints records"),
])
def test_run_options_with_from_trace_are_refused(tmp_path, extra, fragment):
    path = _write(tmp_path, [_x("cpu_op", "aten::mm", 0, 10)])
    code, _, err = _run(["profile", "--from-trace", str(path), *extra])
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err


def test_api_refuses_run_options_and_bad_top(tmp_path):
    path = _write(tmp_path, [_x("cpu_op", "aten::mm", 0, 10)])
    with pytest.raises(SpecError, match="size"):
        lmperf.profile(size="tiny", from_trace=path)
    with pytest.raises(SpecError, match="--top"):
        lmperf.profile(from_trace=path, top=0)
    with pytest.raises(TraceFormatError):
        lmperf.profile(from_trace=tmp_path / "missing.json")


def test_plain_json_and_gzip_read_the_same(tmp_path):
    plain = tmp_path / "cpu.json"
    plain.write_text(cpu_trace_file().read_text())
    packed = tmp_path / "cpu.json.gz"
    with gzip.open(packed, "wt") as f:
        f.write(cpu_trace_file().read_text())
    a, b = analyse_trace(plain), analyse_trace(packed)
    pd.testing.assert_frame_equal(a.tables[PHASE_TABLE], b.tables[PHASE_TABLE])
