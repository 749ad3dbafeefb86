"""Parsing and attribution of torch.profiler Chrome traces: a real CPU trace and a real CUDA trace.

The CPU trace is generated here (tiny model, one unrecorded warm-up step, 3 measured train
steps). The CUDA trace `data/v100_ddp_sgd_5steps.json.gz` is a real Kineto export from
Holistic Trace Analysis's test data (see data/README.md): a V100, DDP with SGD, 5
`ProfilerStep`s, backward's kernels launched from autograd's thread (tid 1262), phase ranges
named "## forward ##" / "## backward ##" / "## optimizer ##", `gpu_user_annotation` copies,
memcpys and memsets. Expectations on it are computed here from the raw JSON (exact decimals),
independently of the parser. Variants of it (a launch removed, annotations renamed or
stripped) are written to a temporary directory where a behaviour needs them.
"""

from __future__ import annotations

import atexit
import functools
import gzip
import json
import shutil
import tempfile
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pandas as pd
import pytest
import torch

from lmperf.questions.profile import overlap
from lmperf.questions.profile.annotate import ATTENTION_RANGES, FINAL_MATMUL, SCORES, SOFTMAX
from lmperf.questions.profile.from_trace import step_table
from lmperf.questions.profile.trace import UNATTRIBUTED, Trace, TraceFormatError, load_trace

DATA = Path(__file__).parent / "data"
REAL_CUDA = DATA / "v100_ddp_sgd_5steps.json.gz"
STEPS, LAYERS = 3, 2
MAIN_TID, AUTOGRAD_TID = 1102, 1262  # of the real CUDA trace
REAL_PHASES = {"## forward ##": "forward", "## backward ##": "backward", "## optimizer ##": "optimizer"}
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


@functools.lru_cache(maxsize=None)
def cpu_trace_file() -> Path:
    """A real CPU trace of 3 measured train steps of a tiny model (written once per session)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    from lmperf.workload.steps import NO_OBSERVER, StepState, train_step
    from lmperf.model import TransformerLM
    from lmperf.questions.profile.annotate import annotate, annotate_attention
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


@functools.lru_cache(maxsize=None)
def real_trace() -> Trace:
    """The real CUDA trace, parsed once per session (tests only read it)."""
    return load_trace(REAL_CUDA)


@functools.lru_cache(maxsize=None)
def real_events() -> tuple[dict, ...]:
    """The real trace's events with exact decimal times (the parser's float64 rounds epoch
    timestamps to 0.25 us)."""
    with gzip.open(REAL_CUDA, "rt", encoding="utf-8") as f:
        return tuple(json.load(f, parse_float=Decimal)["traceEvents"])


@pytest.fixture(scope="module")
def cuda():
    return real_trace()


def _host(trace, name):
    r = trace.ranges
    return r[(r["name"] == name) & ~r["on_device"]]


# --- the real CPU trace ------------------------------------------------------------------------


def test_cpu_trace_has_the_measured_steps_only(cpu):
    assert cpu.device_type == "cpu" and len(cpu.kernels) == 0
    assert cpu.n_steps == STEPS
    # The profiler's own ProfilerStep#N ranges: one per measured step, warm-up step 0 excluded.
    assert step_table(cpu)["profiler_step"].tolist() == [1, 2, 3]
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
    assert t.n_steps == 2 and step_table(t)["profiler_step"].tolist() == [5, 6]
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




# --- the real CUDA trace (V100, DDP + SGD, 5 steps) -----------------------------------------------
# Independent expectations: launches found by correlation id in the raw JSON, steps and phases
# by the ProfilerStep# and "## phase ##" windows holding the launch, unions by a sort-and-sweep
# over exact decimal times.


def _windows(events, pick) -> list[tuple[Decimal, Decimal, str]]:
    return sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
                  if e.get("cat") == "user_annotation" and pick(e["name"]))


@functools.lru_cache(maxsize=None)
def expected_attribution() -> dict[int, tuple[int, str, object, Decimal, Decimal]]:
    """correlation -> (step index, phase, launching tid, device start, device end) of every
    device activity of the real trace, from the raw JSON."""
    events = real_events()
    steps = _windows(events, lambda n: n.startswith("ProfilerStep#"))
    phases = _windows(events, lambda n: n in REAL_PHASES)
    launch = {e["args"]["correlation"]: e for e in events
              if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    out = {}
    for e in events:
        if e.get("cat") not in DEVICE_CATS:
            continue
        at = launch[e["args"]["correlation"]]["ts"]
        in_steps = [i for i, (s, t, _) in enumerate(steps) if s <= at < t]
        in_phases = [REAL_PHASES[n] for s, t, n in phases if s <= at < t]
        assert len(in_steps) == 1 and len(in_phases) == 1, e  # the trace is as we believe
        out[e["args"]["correlation"]] = (in_steps[0], in_phases[0],
                                         launch[e["args"]["correlation"]]["tid"],
                                         e["ts"], e["ts"] + e["dur"])
    return out


def _union_ms(intervals) -> float:
    total, end = Decimal(0), None
    for s, t in sorted(intervals):
        if end is None or s > end:
            total += t - s
            end = t
        elif t > end:
            total += t - end
            end = t
    return float(total) / 1e3


def test_real_trace_metadata(cuda):
    assert cuda.device_type == "cuda" and cuda.n_steps == 5
    assert step_table(cuda)["profiler_step"].tolist() == [101, 102, 103, 104, 105]
    assert Counter(cuda.kernels["kind"]) == {"kernel": 4350, "memcpy": 1600, "memset": 145}
    assert set(cuda.kernels["device"]) == {0} and set(cuda.kernels["stream"]) == {7}
    assert cuda.unattributed_kernels == 0


def test_every_device_activity_in_exactly_one_step_through_its_launch(cuda):
    expected = expected_attribution()
    k = cuda.kernels
    assert len(k) == len(expected) == 4350 + 1600 + 145 and k["correlation"].is_unique
    got = dict(zip(k["correlation"].astype(int), k["step"]))
    assert got == {c: v[0] for c, v in expected.items()}
    assert (k["step"] >= 0).all() and k["in_step"].all()  # ProfilerStep# windows are the steps
    per_step = k.groupby(["step", "kind"]).size().unstack()
    assert (per_step["kernel"] == 870).all() and (per_step["memcpy"] == 320).all()
    assert (per_step["memset"] == 29).all()
    memcpy = k[k["kind"] == "memcpy"]
    assert set(memcpy["launch_name"]) == {"cudaMemcpyAsync"}
    assert set(k.loc[k["kind"] == "memset", "launch_name"]) == {"cudaMemsetAsync"}


def test_phases_from_the_trace_annotations(cuda):
    """"## forward ##" etc. are phases; before, only lmperf's exact names were."""
    expected = expected_attribution()
    got = dict(zip(cuda.kernels["correlation"].astype(int), cuda.kernels["phase"]))
    assert got == {c: v[1] for c, v in expected.items()}
    assert set(cuda.ops["phase"].dropna()) == {"forward", "backward", "optimizer"}


def test_backward_launches_from_autograd_thread_are_attributed(cuda):
    expected = expected_attribution()
    from_autograd = {c for c, v in expected.items() if v[2] == AUTOGRAD_TID}
    assert len(from_autograd) == 3720  # most of backward's device work
    k = cuda.kernels
    mine = k[k["launch_tid"] == AUTOGRAD_TID]
    assert set(mine["correlation"].astype(int)) == from_autograd
    assert (mine["phase"] == "backward").all() and (mine["step"] >= 0).all()
    # the main thread sits in "## backward ##" while autograd's thread launches: by time, any thread
    bwd = _host(cuda, "## backward ##")
    assert set(bwd["tid"]) == {MAIN_TID}
    ops = cuda.ops[cuda.ops["tid"] == AUTOGRAD_TID]
    assert (ops["phase"] == "backward").all()
    nodes = ops[ops["name"].str.startswith("autograd::engine::evaluate_function")]
    assert len(nodes) > 0 and (nodes["self_us"] < nodes["dur_us"]).all()
    for _, g in cuda.ops.groupby("tid"):  # self times partition each thread's top-level ops
        assert g["self_us"].sum() == pytest.approx(g.loc[g["depth"] == 0, "dur_us"].sum(), rel=1e-9)


def test_step_and_phase_busy_time_is_the_union_of_activity_intervals(cuda):
    expected = expected_attribution()
    dev = overlap.breakdown(cuda, phases=True).set_index(["step", "phase"])
    assert len(dev) == 5 * 4  # step, forward, backward, optimizer per step
    for step in range(5):
        for phase in ("step", "forward", "backward", "optimizer"):
            iv = [(v[3], v[4]) for v in expected.values()
                  if v[0] == step and phase in ("step", v[1])]
            row = dev.loc[(step, phase)]
            assert row["activities"] == len(iv)
            assert row["busy_ms"] == pytest.approx(_union_ms(iv), abs=1e-6)
            first, last = min(s for s, _ in iv), max(t for _, t in iv)
            # float64 holds epoch starts to 0.25 us; lengths (busy, kernel) are exact
            assert row["span_ms"] == pytest.approx(float(last - first) / 1e3, abs=5e-4)
            assert row["kernel_ms"] == pytest.approx(float(sum(t - s for s, t in iv)) / 1e3, abs=1e-6)
            assert row["busy_ms"] <= row["span_ms"]


def test_device_phase_walls_come_from_kernels_not_gpu_user_annotation(cuda):
    """Kineto's device copy of "## backward ##" holds only the main thread's few launches (one
    stream, ~28 us); backward's device time is tens of ms of kernels from autograd's thread."""
    walls = overlap.breakdown(cuda, phases=True)
    wide = walls.pivot(index="step", columns="phase", values="span_ms")
    assert wide.index.tolist() == list(range(5))
    assert {"step", "forward", "backward", "optimizer"} <= set(wide.columns)
    expected = expected_attribution()
    for step in range(5):
        bwd = [(v[3], v[4]) for v in expected.values() if v[0] == step and v[1] == "backward"]
        span = float(max(t for _, t in bwd) - min(s for s, _ in bwd)) / 1e3
        assert wide.loc[step, "backward"] == pytest.approx(span, abs=5e-4)
    r = cuda.ranges
    copies = r[r["on_device"]]
    assert "## forward ##" not in set(copies["name"])  # no kernel's innermost range is it
    kineto_bwd = copies[copies["name"] == "## backward ##"]
    assert len(kineto_bwd) == 5 and (kineto_bwd["dur_us"] < 100).all()
    assert (wide["backward"] > 100 * kineto_bwd["dur_us"].max() / 1e3).all()
    # a device copy is placed by its host range (same External id), not by device time
    assert sorted(copies["step"]) == sorted(list(range(5)) * 3)
    phase_of = dict(zip(copies["name"], copies["phase"]))
    assert phase_of == {"DistributedDataParallel.forward": "forward",
                        "## backward ##": "backward", "Optimizer.step#SGD.step": "optimizer"}


def _variant(tmp_path, edit, name: str) -> Trace:
    """The real trace with `edit(doc)` applied, written as plain JSON and parsed."""
    with gzip.open(REAL_CUDA, "rt", encoding="utf-8") as f:
        doc = json.load(f)
    edit(doc)
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return load_trace(path)


def test_implicit_phases_and_a_missing_launch(tmp_path, cuda):
    """Without "## phase ##" ranges: DDP.forward, autograd's nodes and thread, Optimizer.*#
    still give phases; a device activity whose launch is gone (and with it its External id, else
    its launching op places it: test_trace_read) is unattributed, in no step."""
    k = cuda.kernels
    orphan = int(k.loc[(k["phase"] == "backward") & (k["launch_tid"] == AUTOGRAD_TID),
                       "correlation"].iloc[0])

    def edit(doc):
        doc["traceEvents"] = [
            e for e in doc["traceEvents"]
            if not (e.get("cat") == "user_annotation" and e.get("name") in REAL_PHASES)
            and not (e.get("cat") == "cuda_runtime" and e["args"].get("correlation") == orphan)]
        for e in doc["traceEvents"]:
            if e.get("cat") == "kernel" and e["args"].get("correlation") == orphan:
                del e["args"]["External id"]

    t = _variant(tmp_path, edit, "implicit.json")
    k = t.kernels.set_index("correlation")
    o = k.loc[orphan]
    assert o["phase"] == UNATTRIBUTED and o["step"] == -1 and not o["in_step"]
    assert pd.isna(o["launch_us"]) and t.unattributed_kernels == 1
    expected = {c: v[1] for c, v in expected_attribution().items() if c != orphan}
    got = k.drop(index=orphan)["phase"]
    same = sum(got[c] == p for c, p in expected.items())
    # Only what the main thread runs in "## backward ##" before autograd starts has no marker:
    # the loss (aten::cross_entropy_loss: 5 kernels) and backward's seed (aten::ones_like).
    missing = got[got.isna()]
    assert same == len(expected) - len(missing) and len(missing) == 30
    assert set(k.loc[missing.index, "launch_tid"]) == {MAIN_TID}
    dev = overlap.breakdown(t, phases=True).set_index(["step", "phase"])
    assert dev["activities"].xs("step", level="phase").sum() == len(cuda.kernels) - 1
