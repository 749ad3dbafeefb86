"""The doctor's machinery and its CPU checks, one at a time (each runs for real, in a second or
two); the full doctor runs once, through the CLI, in test_cli.py, and as jobs in test_jobs.py."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import pandas as pd
import pytest
import torch

from lmperf.questions.doctor import capjob, environment, numerics, precision, timing, tracing
from lmperf.questions.doctor.api import plan_scopes
from lmperf.questions.doctor.checks import Check, Context, Outcome, fail, ok, run_one, skip
from lmperf.errors import SpecError
from lmperf.runtime import device as dev
from lmperf.workload.build import Prepared

CPU = torch.device("cpu")


# --- the machinery ------------------------------------------------------------------------------------

def test_a_raising_check_is_a_fail_row_with_its_traceback(ctx):
    def broken(c):
        raise KeyError("no such thing")

    out = run_one(Check("broken", "cpu", broken), ctx)
    assert out.status == "fail" and out.result == "KeyError: 'no such thing'"
    assert "KeyError" in out.traceback
    assert run_one(Check("fine", "cpu", lambda c: ok("x")), ctx).status == "ok"


def test_a_launch_runs_once_per_job_and_its_answer_reaches_every_check(ctx):
    started = []

    def launch(c):
        started.append(c.device)
        return lambda: 41 + 1

    first = run_one(Check("first", "cpu", lambda c: ok(str(c.result_of(launch)))), ctx)
    second = run_one(Check("second", "cpu", lambda c: ok(str(c.result_of(launch) + 1))), ctx)
    assert (first.result, second.result) == ("42", "43") and started == [CPU]


def test_a_failing_launch_is_the_failure_of_every_check_that_reads_it(ctx):
    def launch(c):
        def run():
            raise OSError("cannot spawn")
        return run

    for name in ("a", "b"):
        out = run_one(Check(name, "cpu", lambda c: ok(str(c.result_of(launch)))), ctx)
        assert out.status == "fail" and "cannot spawn" in out.result


def test_unknown_status_is_a_bug():
    with pytest.raises(ValueError):
        run_one(Check("odd", "cpu", lambda c: Outcome("maybe")), Context(CPU, Path(".")))


def test_plan_on_this_cpu_skips_cuda_with_the_reason():
    scopes = plan_scopes("auto")
    assert scopes["cpu"] == CPU and scopes["any"] == CPU
    assert scopes["cuda"].startswith("no CUDA device: ")


def test_plan_device_cpu_on_a_gpu_machine_says_so(monkeypatch):
    monkeypatch.setattr(dev, "cuda_available", lambda: True)
    assert plan_scopes("cpu")["cuda"] == "--device cpu: CUDA's paths were not asked for"


@pytest.mark.parametrize("device", ["cuda", "gpu"])
def test_plan_refuses_cuda_without_a_gpu_and_unknown_devices(device):
    with pytest.raises(SpecError):
        plan_scopes(device)


# --- the CPU checks, each for real ----------------------------------------------------------------------

def test_phase_clock_on_the_cpu(ctx):
    out = timing.check_phase_clock(ctx)
    assert out.status == "ok", out
    assert set(out.values["laps_ms"]) == {"forward", "backward", "optimizer"}
    assert out.values["host_ms"] >= out.values["total_ms"]


def _three_phases(state, obs):
    obs.start()
    for phase in ("forward", "backward", "optimizer"):
        sum(range(20_000))  # a few hundred microseconds of work per phase
        obs.lap(phase)


def test_phase_clock_fails_when_the_phases_do_not_sum(ctx, monkeypatch):
    class Skewed(dev.PhaseClock):
        @property
        def total_ms(self):
            return super().total_ms + 5.0  # a clock whose step is not its phases

    monkeypatch.setattr(timing, "tiny_step",
                        lambda device: Prepared(None, _three_phases, 0, "fp32", lambda: (0, {})))
    assert timing.check_phase_clock(ctx).status == "ok"
    monkeypatch.setattr(dev, "PhaseClock", Skewed)
    out = timing.check_phase_clock(ctx)
    assert out.status == "fail" and "sum" in out.why


def test_cpu_peaks(ctx):
    out = timing.check_cpu_peaks(ctx)
    if not dev.PeakMemory(CPU).resettable:
        assert out.status == "fail"
        return
    assert out.status == "ok", out
    assert out.values["during_mib"] - out.values["before_mib"] >= 100


def test_autocast_on_the_cpu(ctx):
    out = precision.check_autocast(ctx)
    assert out.status == "ok", out
    assert out.values["probed"] == len(precision.CPU_EXPECTED)


def test_autocast_fails_on_a_wrong_expectation(ctx, monkeypatch):
    monkeypatch.setattr(precision, "CPU_EXPECTED",
                        {("softmax", "low"): "runs in fp32 (upcast)"})  # CUDA's rule, not the CPU's
    out = precision.check_autocast(ctx)
    assert out.status == "fail" and "softmax(low) under bf16: keeps input dtype" in out.result


def test_the_cuda_expectations_come_from_the_documented_lists():
    expected = precision.cuda_expected()
    assert expected[("matmul", "fp32")] == "casts to low"
    assert expected[("softmax", "low")] == "runs in fp32 (upcast)"


def test_scaler_disabled(ctx):
    out = precision.check_scaler_disabled(ctx)
    assert out.status == "ok", out


def test_flash_torch_against_sdpa(ctx):
    out = numerics.check_flash_torch(ctx)
    assert out.status == "ok", out
    assert out.values["fp32"]["max_abs_err"] < 1e-4


def test_a_wrong_kernel_fails_the_comparison():
    def off(q, k, v, causal):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=not causal)

    out = numerics.judged("wrong", {"fp32": numerics.compare_with_sdpa(off, CPU, torch.float32)})
    assert out.status == "fail"


def test_attribution_counts_stray_events():
    events = pd.DataFrame({"phase": ["forward", "backward", "optimizer", "unattributed", None]})
    out = tracing.attribution(events, "kernels")
    assert out.status == "fail" and out.values["stray"] == 2
    assert tracing.attribution(events.iloc[:3], "kernels").status == "ok"
    assert tracing.attribution(events.iloc[:0], "kernels").status == "fail"


def test_versions(ctx):
    out = environment.check_versions(ctx)
    assert out.status == "ok" and torch.__version__ in out.result
    assert out.values["env"]["device"] == "cpu"


def test_peak_table_on_the_cpu(ctx):
    out = environment.check_peak_table(ctx)
    assert out.status == "ok" and "no entry for a CPU" in out.result


@pytest.mark.parametrize("name, status, fragment", [
    ("NVIDIA H100 80GB HBM3", "ok", "'H100': bf16 989.4"),
    ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "skip", "MIG slice"),
    ("NVIDIA GeForce RTX 2080 Ti", "skip", "matches no entry"),
    ("NVIDIA H100 NVL", "ok", "listed without figures"),
])
def test_peak_table_for_gpu_names(tmp_path, monkeypatch, name, status, fragment):
    monkeypatch.setattr(dev, "device_name", lambda device: name)
    monkeypatch.setattr(dev, "device_memory_gib", lambda device: 79.1)  # an 80 GB card's total
    out = environment.check_peak_table(Context(torch.device("cuda"), tmp_path))
    assert out.status == status and fragment in out.result + out.why


@pytest.mark.parametrize("record, status", [
    ({"status": "oom", "message": "out of memory while allocating 2 GiB: ...", "failed_at": "large",
      "memory_cap": "process address space capped at 1.5 GiB (RLIMIT_AS)"}, "ok"),
    ({"status": "error", "message": "the child process died with SIGKILL"}, "fail"),
    ({"status": "ok", "message": "", "memory_cap": "..."}, "fail"),
])
def test_cap_check_reads_the_childs_record(ctx, record, status):
    done: Future = Future()
    done.set_result([record])
    ctx.launched[capjob.start_cap_job] = done
    out = capjob.check_cap(ctx)
    assert out.status == status, out


def test_alloc_job_inline_is_ok_when_it_fits():
    record = capjob.run_alloc(capjob.AllocSpec(device="cpu", gib=0.01))
    assert record["status"] == "ok" and record["kind"] == "doctor"
    assert capjob.AllocSpec.from_dict(capjob.AllocSpec("cpu", 1.0).to_dict()) == capjob.AllocSpec("cpu", 1.0)


def test_the_fused_scaler_check_runs_its_logic_on_the_cpu(ctx):
    # The CUDA check is device-agnostic: on the CPU, GradScaler("cpu") and fused AdamW (torch
    # >= 2.4) take the same path, so its steps, the skipped inf step and the halving are real.
    out = precision.check_scaler_fused(ctx)
    assert out.status == "ok", out
    assert out.values["scale"][2] == out.values["scale"][1] / 2


def test_scaler_fused_skips_without_fused_adamw(tmp_path, monkeypatch):
    monkeypatch.setattr(dev, "fused_adamw_supported", lambda device: False)
    out = precision.check_scaler_fused(Context(torch.device("cuda"), tmp_path))
    assert out.status == "skip"


def test_outcome_helpers():
    assert ok("r", "w", x=1).values == {"x": 1}
    assert fail("r", "w").status == "fail" and skip("w").result == "-"


def test_cuda_device_row_for_a_mig_slice(tmp_path, monkeypatch):
    for name, value in {"device_name": "NVIDIA A100-SXM4-40GB MIG 1g.5gb",
                        "cuda_capability": (8, 0), "device_memory_gib": 4.75,
                        "bf16_supported": True, "fused_adamw_supported": True}.items():
        monkeypatch.setattr(dev, name, lambda device, v=value: v)
    out = environment.check_cuda_device(Context(torch.device("cuda"), tmp_path))
    assert out.status == "ok" and "sm_80" in out.result and "a MIG slice" in out.result
    assert out.values["mig"] is True
