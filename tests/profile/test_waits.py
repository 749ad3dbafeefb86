"""Where the step waits (issue 34): the device's busy, idle and host-wait time per step and phase
(`overlap.breakdown`), its bound and the headline that opens a profile's findings, on two real
traces: the H200's host-bound lmperf step and the V100's device-bound DDP step. The expected
figures are computed here straight from the trace's events (a device activity belongs to the
step whose `ProfilerStep#N` holds its launch), not with the code under test."""

from __future__ import annotations

import functools
import gzip
import json
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace

import pytest

import lmperf
from lmperf.questions.profile import overlap
from lmperf.questions.profile import job
from lmperf.questions.profile.from_trace import PHASE_TABLE, step_table
from lmperf.questions.profile.report import WAITS_PHASE, WAITS_STEP
from lmperf.questions.profile.trace import load_trace

DATA = Path(__file__).parent / "data"
H200 = DATA / "h200_small_bf16_sdpa_3steps.json.gz"
V100 = DATA / "v100_ddp_sgd_5steps.json.gz"
DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")
H200_BENCHMARKED_STEP_MS = 52.37883758544922  # the run's unprofiled steps (profile.jsonl)


@functools.cache
def direct(path: Path) -> list[dict]:
    """Per ProfilerStep#N, from the raw events: the union of its device activities' intervals
    (busy, ms), of its `kernel` events alone, the span, and the host wait (each gap of the union
    whose next activity's launch call ended after the gap began), by one plain sweep."""
    with gzip.open(path, "rt") as f:  # exact decimals: the V100's epoch times need 16 digits
        events = json.load(f, parse_float=Decimal)["traceEvents"]
    launch = {e["args"]["correlation"]: (e["ts"], e["ts"] + e["dur"]) for e in events
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                   if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    out = []
    for lo, hi in steps:
        acts = sorted((e["ts"], e["ts"] + e["dur"], launch[e["args"]["correlation"]][1], e["cat"])
                      for e in events if e.get("cat") in DEVICE
                      and lo <= launch.get(e["args"].get("correlation"), (-1,))[0] < hi)
        out.append({"busy": _union(acts), "kernels": _union([a for a in acts if a[3] == "kernel"]),
                    "span": float(max(a[1] for a in acts) - acts[0][0]) / 1e3,
                    "host_wait": _host_wait(acts), "activities": len(acts)})
    return out


def _union(acts: list[tuple]) -> float:
    total, start, reach = 0, None, None
    for s, e, *_ in acts:
        if start is None or s > reach:
            total += 0 if start is None else reach - start
            start, reach = s, e
        else:
            reach = max(reach, e)
    return float(total + (reach - start if start is not None else 0)) / 1e3


def _host_wait(acts: list[tuple]) -> float:
    wait, reach = 0, acts[0][1]
    for s, e, returned, _ in acts[1:]:
        if s > reach and returned > reach:
            wait += s - reach
        reach = max(reach, e)
    return float(wait) / 1e3


@functools.cache
def trace(path: Path):
    return load_trace(path)


# lmperf reads times as float64 microseconds: the H200's (~5e12 us) to 1 ns, the V100's epoch
# times (~1.7e15 us) to 0.25 us each, so each merged interval's length to that.
@pytest.mark.parametrize("path, steps, tol_ms", [(H200, 3, 1e-4), (V100, 5, 0.01)])
def test_busy_idle_and_host_wait_match_the_trace_events(path, steps, tol_ms):
    expected = direct(path)
    got = overlap.breakdown(trace(path))
    assert len(expected) == len(got) == steps
    for want, row in zip(expected, got.itertuples()):
        assert row.activities == want["activities"]
        assert row.busy_ms == pytest.approx(want["busy"], abs=tol_ms)
        assert row.span_ms == pytest.approx(want["span"], abs=tol_ms)
        assert row.idle_ms == pytest.approx(want["span"] - want["busy"], abs=tol_ms)
        assert row.host_wait_ms == pytest.approx(want["host_wait"], abs=tol_ms)


def test_the_h200_step_is_host_bound_at_11_8_ms_of_kernels_a_step():
    expected = direct(H200)
    # the run's README: kernels busy 35.5 ms of the 3 profiled steps, 11.8 ms a step; with the
    # 75 memcpys and 150 memsets (device activity, as HTA counts it) 11.95 ms
    assert sum(s["kernels"] for s in expected) == pytest.approx(35.47, abs=0.01)
    per_step = step_table(trace(H200))
    assert per_step["gpu_busy_ms"].tolist() == pytest.approx([s["busy"] for s in expected], abs=1e-4)
    assert per_step["gpu_busy_ms"].mean() == pytest.approx(11.95, abs=0.01)
    assert (per_step["bound"] == "host-bound").all()
    assert (per_step["gpu_host_wait_share"] > 0.85).all() and (per_step["gpu_idle_share"] > 0.87).all()
    report = lmperf.profile(from_trace=H200)
    assert report.headline[0].startswith(
        "host-bound: the GPU was busy 12% of the step (11.95 of 97.31 ms of device span, mean of 3 "
        "step(s); 100% of its idle time waiting for the host's launches); levers: a larger batch")
    assert "CUDA graphs or torch.compile" in report.headline[0]
    phases = report.tables[PHASE_TABLE].set_index("phase")
    assert phases.loc[["forward", "backward", "step"], "bound"].eq("host-bound").all()
    assert phases.loc["step", "gpu_busy_ms"] == pytest.approx(per_step["gpu_busy_ms"].mean())
    assert (phases["gpu_idle_ms"] + phases["gpu_busy_ms"]).tolist() == pytest.approx(
        phases["gpu_span_ms"].tolist())


def test_the_v100_ddp_step_is_device_bound():
    report = lmperf.profile(from_trace=V100)
    assert report.headline[0].startswith("device-bound: the GPU was busy 98% of the step (94.49 of "
                                         "96.01 ms of device span, mean of 5 step(s)")
    assert (report.frame["bound"] == "device-bound").all()


@pytest.mark.parametrize("idle, host, label", [
    (0.88, 0.87, "host-bound"), (0.88, 0.2, "idle"), (0.3, 0.3, "device-bound"),
    (0.5, 0.5, "device-bound"), (float("nan"), 0.0, "device-bound")])
def test_bound(idle, host, label):
    assert overlap.bound(idle, host) == label


def test_a_profiled_run_judges_against_its_benchmarked_step_and_says_it_first():
    # the run's path (`profile_torch`'s `_waits`) on the H200 run's own trace and its benchmarked
    # step: busy 11.95 ms of 52.4 ms unprofiled (the profiler nearly doubles the host's time)
    tables, notes = [], ["(a) forward: ..."]
    cap = SimpleNamespace(unprofiled_ms={"step": [H200_BENCHMARKED_STEP_MS]})
    job._waits(tables, notes, cap, trace(H200))
    assert notes[0] == (
        "host-bound: the GPU was busy 23% of the step (11.95 of 52.38 ms benchmarked; 12% of the "
        "97.31 ms profiled step; 100% of its idle time waiting for the host's launches); levers: "
        f"{overlap.LEVERS}.")
    tables = dict(tables)
    assert list(tables) == [WAITS_STEP, WAITS_PHASE]
    assert (tables[WAITS_STEP]["bound"] == "host-bound").all()


def test_a_cpu_run_says_the_step_is_the_hosts_and_nothing_of_a_gpu():
    tables, notes = [], ["(a) forward: ..."]
    cpu = trace(DATA / "lmperf_tiny_cpu_2steps.json.gz")
    job._waits(tables, notes, SimpleNamespace(unprofiled_ms={"step": [10.0]}), cpu)
    assert tables == [] and notes[0].startswith("No GPU in this run: the whole step")
    report = lmperf.profile(from_trace=DATA / "lmperf_tiny_cpu_2steps.json.gz")
    text = " ".join(report.findings)
    assert "bound" not in text and "GPU was busy" not in text
    assert "bound" not in report.frame and "gpu_busy_ms" not in report.tables[PHASE_TABLE]
