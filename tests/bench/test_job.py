"""End-to-end runs of tiny specs in this process: every mode, regimes, FLOPs, records."""

from __future__ import annotations

import json

import pytest
import torch

from lmperf.questions.bench.job import run_spec
from lmperf.workload.spec import RunSpec
from lmperf.measure.flops import analytic_flops

TINY = dict(context=16, batch=2, warmup=1, steps=3)


@pytest.fixture(autouse=True)
def _restore_torch_state():
    saved = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)
    yield
    torch.set_float32_matmul_precision(saved[0])
    torch.backends.cudnn.allow_tf32 = saved[1]
    assert saved[0] == torch.get_float32_matmul_precision()  # the run restored what it changed


@pytest.mark.parametrize("mode, phases", [
    ("forward", ["forward"]),
    ("forward-backward", ["forward", "backward"]),
    ("train-step", ["forward", "backward", "optimizer"]),
])
def test_each_mode_measures_its_phases(mode, phases):
    spec = RunSpec.from_size("tiny", mode=mode, **TINY)
    rec = run_spec(spec)
    assert rec["status"] == "ok", rec["message"]
    json.dumps(rec, allow_nan=False)  # a record is plain JSON
    m = rec["metrics"]
    assert m["timer"] == "perf_counter"
    for phase in ("forward", "backward", "optimizer"):
        summary = m[f"{phase}_ms"]
        if phase in phases:
            assert len(summary["samples"]) == 3 and all(s > 0 for s in summary["samples"])
            assert summary["min"] <= summary["median"] <= summary["max"]
        else:
            assert summary is None
    # the step brackets its phases: each step's total is at least the sum of its phases
    for i, total in enumerate(m["step_ms"]["samples"]):
        assert total >= sum(m[f"{p}_ms"]["samples"][i] for p in phases) - 1e-6
    # FLOPs were counted on this run and agree exactly with the formula (causal convention)
    est = analytic_flops(64, 2, 256, 10_000, 2, 16, mode, causal=True)
    assert m["flops_per_step"] == m["flops_per_step_analytic"] == est.total
    assert m["tokens_per_s"] == pytest.approx(32 / (m["step_ms"]["median"] / 1e3))
    assert m["mfu"] is None and m["peak_tflops"] is None  # no known peak for a CPU
    assert m["memory"]["kind"] == "cpu_process_peak_rss"
    assert set(m["memory"]["phases"]) == set(phases)
    assert rec["params"] == 1_411_392
    assert rec["spec"] == spec.to_dict()
    assert rec["env"]["device"] == "cpu" and rec["env"]["torch"] == torch.__version__


def test_sdpa_flops_are_counted_on_the_meta_device_and_equal_the_analytic_count():
    rec = run_spec(RunSpec.from_size("tiny", attention="sdpa", mode="forward", **TINY))
    m = rec["metrics"]
    assert rec["status"] == "ok"
    assert m["flops_source"].startswith("torch.utils.flop_counter on the meta device")
    assert m["flops_per_step"] == m["flops_per_step_analytic"]  # one convention for every kernel


def test_flops_fall_back_to_a_real_step_for_a_model_that_cannot_run_on_meta():
    rec = run_spec(RunSpec.from_size("tiny", model="tests.fixtures.models:data_dependent",
                                     mode="forward", **TINY))
    assert rec["status"] == "ok", rec["message"]
    assert rec["metrics"]["flops_source"].startswith("torch.utils.flop_counter on a real step (")
    assert rec["metrics"]["flops_per_step"] == 0  # a bigram table lookup has no matmul


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true", "fp16-mixed", "fp16-mixed-noscale"])
def test_low_precision_regimes_run(precision):
    rec = run_spec(RunSpec.from_size("tiny", precision=precision, optimizer="foreach", **TINY))
    assert rec["status"] == "ok", rec["message"]
    assert rec["metrics"]["math_dtype"] == ("bf16" if "bf16" in precision else "fp16")
    slow_warned = any("fp16" in w and "slower" in w for w in rec["warnings"])
    assert slow_warned == precision.startswith("fp16")


def test_tf32_on_cpu_is_an_unsupported_row_not_a_crash():
    rec = run_spec(RunSpec.from_size("tiny", precision="tf32", **TINY))
    assert rec["status"] == "unsupported"
    assert "tf32" in rec["message"] and rec["metrics"] is None


def test_an_exception_in_the_model_is_an_error_row():
    rec = run_spec(RunSpec.from_size("tiny", model="tests.fixtures.models:raising", **TINY))
    assert rec["status"] == "error"
    assert "boom from the user's model" in rec["message"]
    assert "traceback" in rec


def test_user_model_runs_like_the_reference():
    rec = run_spec(RunSpec.from_size("tiny", model="tests.fixtures.models:bigram", **TINY))
    assert rec["status"] == "ok", rec["message"]
    assert rec["params"] == 10_000 * 10_000
    assert rec["metrics"]["flops_per_step_analytic"] is None  # no formula for a user's model


@pytest.mark.parametrize("optimizer", ["fused", "foreach", "loop"])
def test_each_optimizer_implementation_runs(optimizer):
    rec = run_spec(RunSpec.from_size("tiny", optimizer=optimizer, **TINY))
    assert rec["status"] == "ok" and rec["spec"]["optimizer"] == optimizer


def test_warnings_keep_their_order_spread_then_memory(monkeypatch):
    # as before the envelope: the regime's slowness, the timing spread, then the memory caveat
    from lmperf.questions.bench import job
    from lmperf.runtime.device.memory import PeakMemory

    def no_reset(self: PeakMemory) -> None:
        self.resettable = False  # as where /proc/self/clear_refs is not writable

    monkeypatch.setattr(job, "spread_warning", lambda summaries: "spread")
    monkeypatch.setattr(PeakMemory, "reset", no_reset)
    rec = run_spec(RunSpec.from_size("tiny", mode="forward", **TINY))
    assert rec["status"] == "ok", rec["message"]
    assert rec["warnings"][-2:] == ["spread", "peak RSS could not be reset per phase here; "
                                              "memory peaks are cumulative"]
