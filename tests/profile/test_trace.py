"""Parsing and attribution of torch.profiler Chrome traces: a real CPU trace and a CUDA fixture.

The CPU trace is generated here (tiny model, one unrecorded warm-up step, 3 measured train
steps). The CUDA fixture `data/trace_cuda_min.json` is synthetic (no GPU here), written in the
format Kineto's ChromeTraceLogger writes (libkineto/src/output_json.cpp, CuptiActivity.cpp).
The parser relies only on these fields of it:
- `ph` == "X" (complete events; M, i, s, f events are skipped), `cat`, `name`, `ts`, `dur` (us),
  `pid`, `tid`;
- `cat` values user_annotation / gpu_user_annotation / cpu_op / cuda_runtime / cuda_driver /
  kernel / gpu_memcpy / gpu_memset;
- `args.correlation` on runtime calls and device activities (the launch link), and
  `args.device` / `args.stream` on device activities.
The fixture holds: main-thread ranges ProfilerStep#3 > step > forward (> "computing softmax",
> loss) / backward / optimizer (> Optimizer.step#AdamW.step); a cudaLaunchKernel in forward on
the main thread; a cudaLaunchKernel from the autograd engine thread (tid 4250) in backward whose
kernel runs after the host has left the backward range; a cudaMemcpyAsync + gpu_memcpy in loss; a
fill kernel whose correlation id (999) has no launch; a device-side cuda_sync event; ac2g and
fwdbwd flow events; gpu_user_annotation copies of the ranges; and Kineto's trailing events
("Trace" span, "Iteration Start", "Record Window End" with empty-string pid/tid).
"""

from __future__ import annotations

import atexit
import functools
import gzip
import json
import shutil
import tempfile
from pathlib import Path

import pandas as pd
import pytest
import torch

from lmperf.profile.annotate import ATTENTION_RANGES, FINAL_MATMUL, SCORES, SOFTMAX
from lmperf.profile.trace import UNATTRIBUTED, TraceFormatError, load_trace

DATA = Path(__file__).parent / "data"
CUDA_MIN = DATA / "trace_cuda_min.json"
STEPS, LAYERS = 3, 2
MAIN_TID, AUTOGRAD_TID = 4242, 4250


@functools.lru_cache(maxsize=None)
def cpu_trace_file() -> Path:
    """A real CPU trace of 3 measured train steps of a tiny model (written once per session)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    from lmperf.workload.steps import NO_OBSERVER, StepState, train_step
    from lmperf.model import TransformerLM
    from lmperf.profile.annotate import annotate, annotate_attention
    from lmperf.runtime.precision import autocast, get_regime, grad_scaler

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the host is shared: one thread keeps the steps short and steady
    try:
        torch.manual_seed(0)
        model = TransformerLM(1000, 32, 64, LAYERS, 4, 256)
        assert annotate_attention(model) == LAYERS
        dev, regime = torch.device("cpu"), get_regime("fp32")
        x, y = torch.randint(0, 1000, (2, 32)), torch.randint(0, 1000, (2, 32))
        state = StepState(model, x, y, lambda: autocast(regime, dev), grad_scaler(regime, dev),
                          torch.optim.AdamW(model.parameters(), fused=True), annotate=annotate)
        # repeat=1: without it the schedule starts a new cycle after the active steps and the
        # export after the context finds the events cleared (an empty trace).
        sched = schedule(wait=0, warmup=1, active=STEPS, repeat=1)
        with profile(activities=[ProfilerActivity.CPU], schedule=sched) as prof:
            for _ in range(STEPS + 1):
                train_step(state, NO_OBSERVER)
                prof.step()
        out = Path(tempfile.mkdtemp(prefix="lmperf-trace-"))
        atexit.register(shutil.rmtree, out, ignore_errors=True)
        prof.export_chrome_trace(str(out / "trace_cpu.json"))
        return out / "trace_cpu.json"
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def cpu():
    return load_trace(cpu_trace_file())


@pytest.fixture(scope="module")
def cuda():
    return load_trace(CUDA_MIN)


def _host(trace, name):
    r = trace.ranges
    return r[(r["name"] == name) & ~r["on_device"]]


# --- the real CPU trace ------------------------------------------------------------------------


def test_cpu_trace_has_the_measured_steps_only(cpu):
    assert cpu.device_type == "cpu" and len(cpu.kernels) == 0
    assert cpu.n_steps == STEPS
    # The profiler's own ProfilerStep#N ranges: one per measured step, warm-up step 0 excluded.
    assert cpu.profiler_steps == [1, 2, 3]
    prof = cpu.ranges[cpu.ranges["name"].str.startswith("ProfilerStep#")]
    assert prof["step"].tolist() == [0, 1, 2]


@pytest.mark.parametrize("name", ["step", "forward", "loss", "backward", "optimizer"])
def test_each_phase_range_once_per_step(cpu, name):
    assert sorted(_host(cpu, name)["step"]) == list(range(STEPS))


def test_phases_do_not_overlap_and_lie_in_their_step(cpu):
    phases = cpu.ranges[cpu.ranges["name"].isin(["forward", "backward", "optimizer"])]
    phases = phases.sort_values("start_us")
    assert (phases["end_us"].to_numpy()[:-1] <= phases["start_us"].to_numpy()[1:]).all()
    steps = _host(cpu, "step").set_index("step")
    for _, r in phases.iterrows():
        s = steps.loc[r["step"]]
        assert s["start_us"] <= r["start_us"] and r["end_us"] <= s["end_us"]
    loss, fwd = _host(cpu, "loss").set_index("step"), _host(cpu, "forward").set_index("step")
    assert (loss["start_us"] >= fwd["start_us"]).all() and (loss["end_us"] <= fwd["end_us"]).all()
    assert (_host(cpu, "loss")["phase"] == "forward").all()  # loss is part of forward


def test_every_op_of_a_train_step_is_in_a_phase(cpu):
    ops = cpu.ops
    # The step returns its loss (and grad norm) detached, after its range has closed: that
    # bookkeeping is the only thing outside it.
    outside = ops[~ops["in_step"]]
    assert set(outside["name"]) <= {"aten::detach", "detach"}
    ops = ops[ops["in_step"]]
    assert (ops["step"] >= 0).all()
    assert set(ops["phase"]) == {"forward", "backward", "optimizer"}
    assert set(ops["phase_range"]) == {"forward", "loss", "backward", "optimizer"}
    per_step = ops.groupby(["step", "phase"]).size().unstack()
    assert (per_step.nunique() == 1).all()  # the same op counts in each step
    assert ops.loc[ops["phase"] == "optimizer", "name"].eq("aten::_fused_adamw_").sum() == STEPS
    assert ops.loc[ops["phase_range"] == "loss", "name"].str.contains("nll_loss").any()


def test_self_times_partition_the_top_level_ops(cpu):
    ops = cpu.ops
    assert (ops["self_us"] >= -1e-3).all() and (ops["self_us"] <= ops["dur_us"] + 1e-9).all()
    for _, g in ops.groupby("tid"):
        top = g.loc[g["depth"] == 0, "dur_us"].sum()
        assert g["self_us"].sum() == pytest.approx(top, rel=1e-9)
    # aten::einsum in the attention ranges delegates to bmm: most of its time is not its own
    einsum = ops[ops["name"] == "aten::einsum"]
    assert (einsum["self_us"] < einsum["dur_us"]).all()


def test_attention_subranges_three_per_layer_per_step(cpu):
    att = cpu.ranges[cpu.ranges["name"].isin(ATTENTION_RANGES)]
    counts = att.groupby(["step", "name"]).size()
    assert len(counts) == STEPS * 3 and (counts == LAYERS).all()
    assert (att["phase"] == "forward").all()


def test_attention_ops_attributed_to_their_subrange(cpu):
    ops = cpu.ops[cpu.ops["attention"].notna()]
    assert (ops["phase"] == "forward").all()
    names = ops.groupby("attention")["name"].agg(set)
    assert {"aten::bmm", "aten::where"} <= names[SCORES]
    assert {"aten::amax", "aten::exp", "aten::sum", "aten::div"} <= names[SOFTMAX]
    assert "aten::bmm" in names[FINAL_MATMUL] and "aten::exp" not in names[FINAL_MATMUL]
    per_step = ops[ops["name"] == "aten::exp"].groupby("step").size()
    assert (per_step == LAYERS).all()  # one exp per naive softmax


def test_attribution_is_by_time_on_any_thread(tmp_path):
    """On the CPU, autograd runs backward on the calling thread; move the backward ops of a real
    trace to another thread (as the CUDA autograd engine does) and they must stay in backward."""
    doc = json.loads(cpu_trace_file().read_text())
    events = doc["traceEvents"]
    bwd = [(e["ts"], e["ts"] + e["dur"]) for e in events
           if e.get("cat") == "user_annotation" and e["name"] == "backward"]
    main = {e["tid"] for e in events if e.get("cat") == "user_annotation" and e["name"] == "backward"}
    assert len(main) == 1 and len(bwd) == STEPS
    other = next(iter(main)) + 1
    moved = 0
    for e in events:
        if e.get("cat") == "cpu_op" and any(s <= e["ts"] < t for s, t in bwd):
            e["tid"] = other
            moved += 1
    path = tmp_path / "trace_cpu_rethreaded.json"
    path.write_text(json.dumps(doc))
    original, rethreaded = load_trace(cpu_trace_file()), load_trace(path)
    b = rethreaded.ops[rethreaded.ops["tid"] == other]
    assert len(b) == moved > 0
    assert (b["phase"] == "backward").all() and (b["step"] >= 0).all()
    assert (original.ops["phase"] == "backward").sum() == moved
    assert original.ops["self_us"].sum() == pytest.approx(rethreaded.ops["self_us"].sum())


def test_trailing_metadata_events_are_skipped(cpu):
    doc = json.loads(cpu_trace_file().read_text())
    tail = doc["traceEvents"][-1]
    assert tail["name"] == "Record Window End" and tail["pid"] == ""  # what Kineto writes last
    n_ranges = sum(e.get("cat") == "user_annotation" for e in doc["traceEvents"])
    assert len(cpu.ranges) == n_ranges
    assert len(cpu.ops) == sum(e.get("cat") == "cpu_op" for e in doc["traceEvents"])


def test_gzipped_trace_reads_the_same(tmp_path, cpu):
    path = tmp_path / "trace.json.gz"
    with gzip.open(path, "wt") as f:
        f.write(cpu_trace_file().read_text())
    again = load_trace(path)
    assert again.n_steps == cpu.n_steps and len(again.ops) == len(cpu.ops)


def _write_ranges(tmp_path, ranges, ops=()):
    """A minimal trace of user_annotation ranges and cpu_ops, (name, ts, dur) each."""
    ev = [{"ph": "X", "cat": "user_annotation", "name": n, "pid": 1, "tid": 1, "ts": t, "dur": d}
          for n, t, d in ranges]
    ev += [{"ph": "X", "cat": "cpu_op", "name": n, "pid": 1, "tid": 1, "ts": t, "dur": d} for n, t, d in ops]
    path = tmp_path / "trace_min.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    return load_trace(path)


def test_steps_inside_warmup_are_not_measured(tmp_path):
    t = _write_ranges(tmp_path, [("warmup", 0, 100), ("step", 10, 50), ("ProfilerStep#0", 200, 100),
                                 ("step", 210, 80), ("ProfilerStep#1", 300, 100), ("step", 310, 80)],
                      ops=[("aten::mm", 20, 5), ("aten::mm", 220, 5), ("profiler_work", 295, 2)])
    assert t.n_steps == 2
    assert t.ops["step"].tolist() == [-1, 0, 0]  # the warm-up op is in no step
    assert t.ops["in_step"].tolist() == [False, True, False]  # in ProfilerStep#0, not in its step


def test_profiler_steps_are_the_steps_without_step_ranges(tmp_path):
    t = _write_ranges(tmp_path, [("ProfilerStep#5", 0, 100), ("forward", 10, 50),
                                 ("ProfilerStep#6", 100, 100)],
                      ops=[("aten::mm", 20, 5), ("aten::add", 150, 5)])
    assert t.n_steps == 2 and t.profiler_steps == [5, 6]
    assert t.ops["step"].tolist() == [0, 1]
    assert t.ops["phase"].tolist()[0] == "forward" and pd.isna(t.ops["phase"].tolist()[1])


def test_not_a_trace_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": ')
    with pytest.raises(TraceFormatError, match="cannot read trace"):
        load_trace(bad)
    bad.write_text('{"events": []}')
    with pytest.raises(TraceFormatError, match="traceEvents"):
        load_trace(bad)


# --- the synthetic CUDA fixture ----------------------------------------------------------------


def test_cuda_fixture_metadata(cuda):
    assert cuda.device_type == "cuda" and cuda.device == "cuda"
    assert cuda.n_steps == 1 and cuda.profiler_steps == [3]
    # kernels, the memcpy and the orphan; the cuda_sync device event is not a kernel
    assert sorted(cuda.kernels["kind"]) == ["kernel"] * 5 + ["memcpy"]
    assert (cuda.kernels["device"] == 0).all() and (cuda.kernels["stream"] == 7).all()
    assert set(cuda.launches["name"]) == {"cudaLaunchKernel", "cudaMemcpyAsync", "cudaDeviceSynchronize"}


def test_cuda_backward_kernel_from_autograd_thread_lands_in_backward(cuda):
    k = cuda.kernels.set_index("name")
    gemm = k.loc["ampere_sgemm_64x64_nn"]
    bwd = _host(cuda, "backward").iloc[0]
    assert bwd["tid"] == MAIN_TID and gemm["launch_tid"] == AUTOGRAD_TID
    assert gemm["start_us"] > bwd["end_us"]  # it ran on the device while the host was in optimizer
    assert gemm["phase"] == "backward" and gemm["in_step"] and gemm["step"] == 0
    assert k.loc["ampere_sgemm_128x64_tn", "phase"] == "forward"
    adam = k[k.index.str.contains("FusedAdamMathFunctor")]
    assert (adam["phase"] == "optimizer").all()


def test_cuda_autograd_thread_ops_in_backward_with_self_times(cuda):
    ops = cuda.ops[cuda.ops["tid"] == AUTOGRAD_TID].set_index("name")
    assert (ops["phase"] == "backward").all()
    assert ops.loc["autograd::engine::evaluate_function: MmBackward0", "self_us"] == pytest.approx(4.0)
    assert ops.loc["MmBackward0", "self_us"] == pytest.approx(26.0)
    assert ops.loc["aten::mm", "self_us"] == pytest.approx(60.0)
    assert ops["depth"].tolist() == [0, 1, 2]


def test_cuda_memcpy_attributed_through_its_launch(cuda):
    m = cuda.kernels[cuda.kernels["kind"] == "memcpy"].iloc[0]
    assert m["name"].startswith("Memcpy HtoD") and m["launch_name"] == "cudaMemcpyAsync"
    assert (m["phase"], m["phase_range"], m["step"]) == ("forward", "loss", 0)


def test_cuda_kernel_without_launch_is_unattributed(cuda):
    orphan = cuda.kernels[cuda.kernels["correlation"] == 999]
    assert len(orphan) == 1 and cuda.unattributed_kernels == 1
    o = orphan.iloc[0]
    # it ran inside the host's backward window, but time on the device proves nothing
    assert o["phase"] == UNATTRIBUTED and o["phase_range"] == UNATTRIBUTED
    assert not o["in_step"] and o["step"] == -1 and pd.isna(o["launch_us"])


def test_cuda_softmax_kernel_in_attention_subrange(cuda):
    k = cuda.kernels
    assert k.loc[k["attention"] == SOFTMAX, "name"].str.contains("exp_kernel_cuda").all()
    assert (k["attention"] == SOFTMAX).sum() == 1


def test_cuda_device_ranges_are_placed_on_the_device_timeline(cuda):
    dev = cuda.ranges[cuda.ranges["on_device"]].set_index("name")
    assert (dev["step"] == 0).all()
    assert dev.loc["backward", "phase"] == "backward" and dev.loc["loss", "phase"] == "forward"
    assert pd.isna(dev.loc["step", "phase"])  # a step holds phases but is in none
