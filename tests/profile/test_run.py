"""`lmperf profile` end to end on the CPU: the course's questions answered, records, exports."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lmperf.workload.spec import RunSpec
from lmperf.cli import main
from lmperf.profile.annotate import ATTENTION_RANGES
from lmperf.profile.run import profile_torch
from lmperf.profile.trace import load_trace
from lmperf.profile.nsys import parse_kern_sum_csv
from tests.profile.test_nsys import DATA, _fake_nsys

QUICK = dict(context_length=32, batch_size=2, warmup=1, steps=3)


@pytest.fixture(scope="module")
def train(tmp_path_factory):
    path = tmp_path_factory.mktemp("prof") / "trace.json"
    return profile_torch(RunSpec.from_size("tiny", **QUICK), path, top=5)


def test_answers_each_question_with_a_table_and_a_finding(train):
    titles = [t for t, _ in train.tables]
    assert titles[0].startswith("phase times")
    for phase in ("forward", "backward", "optimizer", "step"):
        assert f"top operators (self time): {phase}" in titles
    assert "share of each phase by category" in titles
    assert "forward vs whole step (top entries side by side)" in titles
    assert "attention: runtime vs FLOPs per forward step" in titles
    for q in ("(a)", "(b)", "(c)", "(d)", "(e)"):
        assert any(n.startswith(q) for n in train.notes), q


def test_phase_times_cover_every_profiled_step(train):
    df = dict(train.tables)["phase times: benchmarked vs profiled (ms per step, mean ± std)"]
    assert list(df["phase"]) == ["forward", "backward", "optimizer", "step"]
    assert all("±" in v for v in df["trace_range_ms"])


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


def test_cli_writes_record_trace_and_csv(tmp_path, capsys):
    out, trace, csv = tmp_path / "p.jsonl", tmp_path / "t.json", tmp_path / "csv"
    code = main(["profile", "--size", "tiny", "--context", "32", "--batch", "2", "--steps", "2",
                 "--warmup", "1", "--mode", "forward", "--out", str(out), "--trace", str(trace),
                 "--csv", str(csv), "--format", "markdown"])
    assert code == 0
    printed = capsys.readouterr().out
    (record,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert record["kind"] == "profile" and record["status"] == "ok"
    assert record["spec"]["backend"] == "torch" and record["spec"]["mode"] == "forward"
    assert record["metrics"]["trace_path"] == str(trace) and trace.exists()
    assert "#### top operators (self time): forward" in printed
    assert "backward" not in " ".join(record["metrics"]["tables"])  # forward mode: no backward table
    assert sorted(p.suffix for p in csv.iterdir()) == [".csv"] * len(record["metrics"]["tables"])


def test_nsys_backend_without_nsys_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nsys anywhere on PATH
    code = main(["profile", "--size", "tiny", "--backend", "nsys", "--out", str(tmp_path / "p.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and "nsys is not on PATH; use --backend torch" in err
    assert len(err.strip().splitlines()) == 1


def test_nsys_backend_builds_tables_from_nsys_reports(tmp_path, capsys, monkeypatch):
    exe, log = _fake_nsys(tmp_path)
    monkeypatch.setenv("PATH", str(Path(exe).parent) + os.pathsep + os.environ["PATH"])
    out = tmp_path / "p.jsonl"
    code = main(["profile", "--size", "tiny", "--backend", "nsys", "--steps", "4",
                 "--out", str(out), "--trace", str(tmp_path / "rep")])
    assert code == 0, capsys.readouterr().err
    record = json.loads(out.read_text())
    tables = record["metrics"]["tables"]
    assert "top kernels (nsys): forward" in tables and "top kernels (nsys): backward" in tables
    row = tables["top kernels (nsys): forward"][0]
    fixture = parse_kern_sum_csv((DATA / "nsys_cuda_gpu_kern_sum.csv").read_text()).iloc[0]
    assert row["name"] == fixture["name"]
    assert row["calls_per_step"] == pytest.approx(fixture["calls"] / 4)  # nsys sums all 4 steps
    assert row["ms_per_step"] == pytest.approx(fixture["total_ms"] / 4)
    calls = [json.loads(x)["argv"] for x in log.read_text().splitlines()]
    assert calls[0][0] == "profile" and "--capture-range=nvtx" in calls[0]
    assert any("--filter-nvtx=backward" in c for c in calls)


@pytest.mark.parametrize("argv, fragment", [
    (["profile", "--top", "0"], "--top must be a positive integer"),
    (["profile", "--size", "huge"], "unknown size 'huge'"),
    (["profile", "--precision", "tf33"], "unknown precision 'tf33'"),
])
def test_bad_input_is_one_line(argv, fragment, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1


def test_nsys_child_runs_its_steps_without_nvtx(tmp_path):
    """The process nsys launches: on a CPU build (no NVTX) it still runs to completion."""
    import subprocess
    import sys

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(RunSpec.from_size("tiny", **QUICK).to_dict()))
    done = subprocess.run([sys.executable, "-m", "lmperf.profile.nsys_child", str(spec)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
