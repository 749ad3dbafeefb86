"""The job of one regime (run_train): determinism, early stops with a recorded outcome, loss
scaling, failures as records."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import torch

from lmperf.questions.train.job import run_train
from lmperf.questions.train.spec import TrainSpec
from tests.train.faults import nan_loss_at
from tests.train.golden import compute_curves

CPU = torch.device("cpu")
REPO = Path(__file__).resolve().parents[2]


def _run(regimes, faults=None, **kw):
    base = {"context": 16, "batch": 2, "steps": 8, "lr_warmup": 2, "eval_interval": 4,
            "eval_batches": 1, "seed": 5}
    events = []
    records = [run_train(TrainSpec.from_size("tiny", name, **{**base, **kw}),
                         fault=(faults or {}).get(name, lambda step, loss: loss),
                         progress=lambda r, e: events.append((r, e))) for name in regimes]
    return records, events


def _losses(record):
    return [e["loss"] for e in record["metrics"]["log"]]


def test_fp32_is_bitwise_reproducible_in_process():
    a, _ = _run(["fp32", "bf16-mixed"])
    b, _ = _run(["fp32", "bf16-mixed"])
    for ra, rb in zip(a, b):
        assert _losses(ra) == _losses(rb)  # exact equality, not approx
        assert [e["grad_norm"] for e in ra["metrics"]["log"]] == [e["grad_norm"] for e in rb["metrics"]["log"]]
        assert ra["metrics"]["evals"][-1]["val_loss"] == rb["metrics"]["evals"][-1]["val_loss"]


def test_fp32_is_bitwise_reproducible_across_processes():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    out = subprocess.run([sys.executable, "-m", "tests.train.regen_golden", "--print", "fp32"],
                         capture_output=True, text=True, cwd=REPO, env=env, timeout=120, check=True)
    child = json.loads(out.stdout)
    here = compute_curves(("fp32",))["fp32"]
    assert child["losses"] == here["losses"] and child["val_losses"] == here["val_losses"]


def test_records_are_self_contained_and_json_ready():
    records, events = _run(["fp32"])
    r = records[0]
    assert r["kind"] == "train" and r["status"] == "ok" and isinstance(r["spec"], dict)
    json.dumps(r, allow_nan=False)  # what append_record requires
    assert r["spec"]["precision"] == "fp32" and r["spec"]["data"] is None and r["env"]["torch"]
    assert r["corpus"]["source"] == "builtin" and r["corpus"]["val_tokens"] > 0
    m = r["metrics"]
    assert m["outcome"] == "completed" and m["summary"]["steps_run"] == 8 and len(m["log"]) == 8
    assert [e["step"] for e in m["evals"]] == [0, 4, 8]
    entry = m["log"][0]
    assert set(entry) == {"step", "lr", "loss", "grad_norm", "scale", "skipped", "step_ms",
                          "cpu_step_ms", "tokens_per_s", "peak_mib"}
    assert entry["scale"] is None and entry["skipped"] is False and entry["step_ms"] > 0
    # the same steps in CPU time (one sync per step, as bench's step), timed steps summarised
    assert entry["cpu_step_ms"] > 0 and m["timer_sync"] == "step"
    assert m["cpu_time"]["step_ms"]["n"] == m["summary"]["step_ms"]["n"]
    assert m["memory_kind"] == "cpu_process_peak_rss" and m["summary"]["peak_mib"] > 50
    kinds = [e["event"] for _, e in events]
    assert kinds[0] == "start" and kinds[-1] == "end" and kinds.count("step") == 8
    assert [e["val_loss"] is not None for _, e in events if e["event"] == "step"] == [
        False, False, False, True, False, False, False, True]


def test_injected_nan_stops_that_regime_and_the_others_continue():
    records, _ = _run(["fp32", "bf16-mixed"], faults={"fp32": nan_loss_at(3)})
    stopped, other = records
    m = stopped["metrics"]
    assert stopped["status"] == "ok" and m["outcome"] == "non_finite_loss" and m["outcome_step"] == 3
    assert len(m["log"]) == 3 and m["log"][-1]["loss"] == "nan"
    assert "step 3" in m["outcome_detail"]
    assert [e["step"] for e in m["evals"]] == [0]  # no evaluation of a NaN model
    assert other["metrics"]["outcome"] == "completed" and len(other["metrics"]["log"]) == 8


def test_rising_loss_is_diverged():
    def blow_up(step, loss):
        return loss * 10 if step == 4 else loss
    records, _ = _run(["fp32"], faults={"fp32": blow_up})
    m = records[0]["metrics"]
    assert (m["outcome"], m["outcome_step"]) == ("diverged", 4)
    assert "above 2 x the first step's" in m["outcome_detail"]


class _InfGrad(torch.autograd.Function):
    """Identity forward, infinite gradient backward: a finite loss whose gradients overflow."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * float("inf")


def test_scaler_skips_overflowing_steps_then_run_is_diverged():
    records, _ = _run(["fp16-mixed"], faults={"fp16-mixed": lambda s, loss: _InfGrad.apply(loss)},
                      diverge_bad_grads=4)
    m = records[0]["metrics"]
    log = m["log"]
    assert (m["outcome"], m["outcome_step"]) == ("diverged", 4)
    assert [e["scale"] for e in log] == [65536.0, 32768.0, 16384.0, 8192.0]
    assert all(e["skipped"] for e in log) and m["summary"]["skipped_steps"] == 4
    assert m["summary"]["final_scale"] == 4096.0
    assert all(e["grad_norm"] in ("inf", "nan") for e in log)
    assert m["nonfinite_params"] == 0  # every update was skipped: the weights are untouched


def test_fp16_mixed_logs_a_scale_per_step():
    records, _ = _run(["fp16-mixed"])
    log = records[0]["metrics"]["log"]
    assert all(e["scale"] == 65536.0 for e in log)  # no overflow in 8 steps of this model
    assert records[0]["metrics"]["summary"]["final_scale"] == 65536.0


def test_fp16_true_failure_is_a_recorded_outcome():
    records, _ = _run(["fp16-true"])
    m = records[0]["metrics"]
    assert records[0]["status"] == "ok" and m["outcome"] == "non_finite_loss"
    assert m["outcome_step"] == 2 and m["nonfinite_params"] > 0


def test_unsupported_regime_is_a_record_and_the_rest_run():
    records, _ = _run(["tf32", "fp32"])
    assert records[0]["status"] == "unsupported" and "TF32" in records[0]["message"]
    assert records[1]["status"] == "ok"


def test_a_crash_is_an_error_record_and_the_rest_run(monkeypatch):
    import lmperf.questions.train.loop as loop

    real = loop.build_state

    def broken(spec, regime, device, fault):
        if regime.name == "fp32":
            raise RuntimeError("boom")
        return real(spec, regime, device, fault)
    monkeypatch.setattr(loop, "build_state", broken)
    records, _ = _run(["fp32", "bf16-mixed"])
    assert records[0]["status"] == "error"
    assert records[0]["message"] == "RuntimeError while building the model: boom"
    assert "traceback" in records[0]
    assert records[1]["status"] == "ok" and math.isfinite(records[1]["metrics"]["summary"]["final_loss"])


def test_out_of_memory_is_an_oom_record(monkeypatch):
    import lmperf.questions.train.loop as loop

    def no_memory(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 GB")
    monkeypatch.setattr(loop, "build_state", no_memory)
    records, _ = _run(["fp32"])
    assert records[0]["status"] == "oom" and "traceback" not in records[0]
    assert records[0]["message"].startswith("out of memory while building the model: ")
    assert records[0]["corpus"]["source"] == "builtin"  # the data was loaded by then


def test_the_spread_warning_agrees_with_the_finding(monkeypatch):
    """tokens/s comes from the median step: a noisy run's warning must not say it includes the
    slow steps, as the report's finding says it does not (issue 28)."""
    from lmperf.questions.train import loop

    monkeypatch.setattr(loop, "spread_warning", lambda summaries: "IQR/median step 40%")
    records, _ = _run(["fp32"], steps=4, eval_interval=4)
    (warning,) = [w for w in records[0]["warnings"] if w.startswith("IQR/median")]
    assert "the median (and tokens/s, from it) does not" in warning
    assert "tokens/s include" not in warning
