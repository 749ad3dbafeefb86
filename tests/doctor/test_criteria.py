"""Every doctor criterion can fail (issue 34): a failing case for each check the other test files
do not already fail, with the measured values faked at the seam the check reads them from (the
device layer, a launch's answer, a measurement function), and `FAILING_CASES`, which names the
failing test of every check in the registry, so that a new check without one fails here."""

from __future__ import annotations

import contextlib
import importlib
from concurrent.futures import Future
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from lmperf.questions.doctor import environment, gpu, lowp as doctor_lowp, numerics, precision
from lmperf.questions.doctor import registry, timing, tracing
from lmperf.questions.doctor.checks import Context
from lmperf.runtime import device as dev
from lmperf.workload.build import Prepared
from lmperf.units import MIB
from tests.fixtures.lowp import AVX2_ONLY, SAPPHIRE_RAPIDS, simulate_cpu

CPU = torch.device("cpu")
CUDA = torch.device("cuda")

FAILING_CASES: dict[str, str] = {
    # check function -> its failing test ("module::test" under tests/doctor)
    "check_versions": "test_criteria::test_versions_fail_without_an_env_field",
    "check_peak_table": "test_criteria::test_peak_table_fails_on_disordered_figures_or_another_variants_memory",
    "check_cuda_device": "test_criteria::test_cuda_device_fails_without_fused_adamw",
    "check_phase_clock": "test_checks::test_phase_clock_fails_when_the_phases_do_not_sum",
    "check_ceilings": "test_ceilings::test_the_h200s_128_x_128_ceilings_fail_with_their_share_of_the_peak",
    "check_cpu_peaks": "test_criteria::test_cpu_peaks_fail_when_the_peak_does_not_move",
    "check_cuda_peaks": "test_criteria::test_allocator_peaks_fail_when_forward_adds_nothing",
    "check_cap": "test_checks::test_cap_check_reads_the_childs_record",
    "check_autocast": "test_checks::test_autocast_fails_on_a_wrong_expectation",
    "check_lowp_matmuls": "test_criteria::test_lowp_fails_where_a_native_dtype_is_slow",
    "check_scaler_disabled": "test_criteria::test_scaler_disabled_fails_with_an_enabled_scaler",
    "check_scaler_fused": "test_criteria::test_scaler_fused_fails_without_the_fused_optimizer",
    "check_profile": "test_criteria::test_profiled_steps_fail_with_stray_events",
    "check_snapshot": "test_criteria::test_snapshot_fails_without_history",
    "check_nvtx": "test_criteria::test_nvtx_fails_as_a_no_op",
    "check_flash_torch": "test_criteria::test_flash_torch_fails_with_a_wrong_kernel",
    "check_flash_triton": "test_criteria::test_flash_triton_fails_when_its_child_fails",
    "check_flash_triton_shapes": "test_criteria::test_flash_triton_shapes_fail_beyond_a_bound",
    "check_tf32": "test_gpu_checks::test_tf32_that_changes_nothing_on_sm80_fails",
    "check_call_timer": "test_gpu_checks::test_call_timer_far_from_the_host_clock_fails",
    "check_oom_snapshot": "test_criteria::test_oom_snapshot_fails_without_a_dump",
    "check_collectives": "test_gpu_checks::test_one_wrong_collective_on_one_rank_fails_naming_it",
    "check_strategies": "test_gpu_checks::test_strategies_fail_beyond_the_bound",
    "check_memory_cap": "test_gpu_checks::test_a_rank_capped_on_another_gpu_fails",
}


def test_every_check_in_the_registry_has_a_failing_case():
    checks = {entry.run.__name__ for entry in registry.ENTRIES}
    assert checks == set(FAILING_CASES)
    for case in FAILING_CASES.values():
        module, name = case.split("::")
        assert callable(getattr(importlib.import_module(f"tests.doctor.{module}"), name)), case


def test_versions_fail_without_an_env_field(ctx, monkeypatch):
    from lmperf.runtime import env as envmod

    real = envmod.capture
    assert environment.check_versions(ctx).status == "ok"
    monkeypatch.setattr(envmod, "capture", lambda device: {k: v for k, v in real(device).items()
                                                           if k != "timestamp"})
    out = environment.check_versions(ctx)
    assert out.status == "fail" and out.why == "env capture lacks timestamp"


def _gpu(monkeypatch, name: str, memory_gib: float) -> None:
    monkeypatch.setattr(dev, "device_name", lambda device: name)
    monkeypatch.setattr(dev, "device_memory_gib", lambda device: memory_gib)


def test_peak_table_fails_on_disordered_figures_or_another_variants_memory(tmp_path, monkeypatch):
    from lmperf.runtime import peaks

    ctx = Context(CUDA, tmp_path)
    _gpu(monkeypatch, "NVIDIA H200", 139.80072021484375)  # the H200 run's CUDA device row
    out = environment.check_peak_table(ctx)
    assert out.status == "ok", out
    assert out.result.endswith("fp32 66.9, fp8 1978.9 TFLOP/s; CUDA reports 139.8 of its 141 GiB")
    # an H100 NVL (94 GB) whose name matched the 80 GB H100's entry: MFU off by its figures
    _gpu(monkeypatch, "NVIDIA H100 80GB HBM3", 93.1)
    out = environment.check_peak_table(ctx)
    assert out.status == "fail" and "CUDA reports 93.1 of its 80 GiB" in out.result
    # an entry with fp32 and bf16 swapped
    _gpu(monkeypatch, "NVIDIA H200", 139.8)
    real = peaks.lookup_peak
    swap = {"fp32": "bf16", "bf16": "fp32"}
    monkeypatch.setattr(peaks, "lookup_peak", lambda name, d: real(name, swap.get(d, d)))
    assert environment.check_peak_table(ctx).status == "fail"


def test_cuda_device_fails_without_fused_adamw(tmp_path, monkeypatch):
    for name, value in {"device_name": "NVIDIA H200", "cuda_capability": (9, 0),
                        "device_memory_gib": 139.8, "bf16_supported": True,
                        "fused_adamw_supported": False}.items():
        monkeypatch.setattr(dev, name, lambda device, v=value: v)
    out = environment.check_cuda_device(Context(CUDA, tmp_path))
    assert out.status == "fail" and "fused AdamW no" in out.result


def test_cpu_peaks_fail_when_the_peak_does_not_move(ctx, monkeypatch):
    class Flat(dev.PeakMemory):
        def read(self):
            return {"rss": 500.0}  # a peak that ignores the 128 MiB allocation

    monkeypatch.setattr(dev, "PeakMemory", Flat)
    out = timing.check_cpu_peaks(ctx)
    assert out.status == "fail"


class _Allocator:
    """The CUDA allocator's peaks as `PeakMemory` reads them, from a script of values (MiB)."""

    cuda, kind = True, "cuda_allocator"

    def __init__(self, device, script):
        self.device, self.script = device, iter(script)

    def reset(self):
        pass

    def read(self):
        return {"allocated": next(self.script)}


@pytest.mark.parametrize("forward, status", [(86.7, "ok"), (80.6, "fail")])
def test_allocator_peaks_fail_when_forward_adds_nothing(ctx, monkeypatch, forward, status):
    # reads: start, forward's peak, held, backward's, held, optimizer's, held, after a reset
    script = [80.6, forward, 80.6, 89.1, 80.6, 86.0, 80.6, 80.6]  # the H200's row, in MiB
    monkeypatch.setattr(dev, "PeakMemory", lambda device: _Allocator(device, script))
    monkeypatch.setattr(dev, "memory_allocated", lambda device: 80.6 * MIB)
    monkeypatch.setattr(timing, "tiny_step", lambda device: Prepared(
        None, _phases, 0, "fp32", lambda: (0, {})))
    assert timing.check_cuda_peaks(ctx).status == status


def _phases(state, obs):
    obs.start()
    for phase in ("forward", "backward", "optimizer"):
        obs.lap(phase)


def test_lowp_fails_where_a_native_dtype_is_slow(monkeypatch, tmp_path):
    # a CPU whose flags say native bf16 but whose bf16 matmuls take 12x fp32's time: the defaults
    # trust the flags and would keep the slow regime
    simulate_cpu(monkeypatch, tmp_path, SAPPHIRE_RAPIDS, ratio=12.0)
    out = doctor_lowp.check_lowp_matmuls(Context(CPU, tmp_path))
    assert out.status == "fail" and out.result.startswith("failing: bf16, fp16; bf16 12x")
    simulate_cpu(monkeypatch, tmp_path / "avx2", AVX2_ONLY, ratio=12.0)  # slow, not native: ok
    assert doctor_lowp.check_lowp_matmuls(Context(CPU, tmp_path)).status == "ok"
    # a GPU: the H200's ratios (0.065x, 0.067x) pass; tensor cores not used (1.3x) fail
    for name, value in {"cuda_capability": (9, 0), "bf16_supported": True}.items():
        monkeypatch.setattr(dev, name, lambda device, v=value: v)
    for ratio, status in ((0.065, "ok"), (1.3, "fail")):
        simulate_cpu(monkeypatch, tmp_path / str(ratio), None, ratio=ratio)
        assert doctor_lowp.check_lowp_matmuls(Context(CUDA, tmp_path)).status == status


def test_scaler_disabled_fails_with_an_enabled_scaler(ctx, monkeypatch):
    from lmperf.runtime import precision as regimes

    monkeypatch.setattr(regimes, "grad_scaler",
                        lambda regime, device: torch.amp.GradScaler("cpu", init_scale=1024.0))
    out = precision.check_scaler_disabled(ctx)
    assert out.status == "fail" and out.result.startswith("enabled=True")


def test_scaler_fused_fails_without_the_fused_optimizer(ctx, monkeypatch):
    real = timing.tiny_step

    def unfused(device, precision="fp32", warmup=1):
        prepared = real(device, precision, warmup)
        prepared.state.optimizer.defaults["fused"] = False  # what the check reads of the optimizer
        return prepared

    monkeypatch.setattr(timing, "tiny_step", unfused)
    out = precision.check_scaler_fused(ctx)
    assert out.status == "fail" and out.result.startswith("AdamW: ")


@pytest.mark.parametrize("device, table", [(CPU, "ops"), (CUDA, "kernels")])
def test_profiled_steps_fail_with_stray_events(tmp_path, monkeypatch, device, table):
    ctx = Context(device, tmp_path)
    events = pd.DataFrame({"phase": ["forward", "backward", "optimizer", "unattributed"]})
    trace = SimpleNamespace(**{table: events})
    monkeypatch.setattr(tracing, "profiled_trace", lambda c: (None, trace))
    out = tracing.check_profile(ctx)
    assert out.status == "fail" and out.values["stray"] == 1
    setattr(trace, table, events.iloc[:3])
    assert tracing.check_profile(ctx).status == "ok"


def test_snapshot_fails_without_history(tmp_path, monkeypatch):
    from lmperf.questions.memory import snapshot_read, snapshot_record

    path = tmp_path / "snapshot.pickle"
    path.write_bytes(b"")
    monkeypatch.setattr(snapshot_record, "record_snapshot", lambda spec, p, overwrite: SimpleNamespace(
        status="ok", path=path, message=""))
    for events, status in ((991, "ok"), (0, "fail")):  # 991: the H200's tiny step
        monkeypatch.setattr(snapshot_read, "summarize_snapshot", lambda p, e=events: SimpleNamespace(
            events=e, peak_active_bytes=92964956 if e else 0, segments=6))
        assert tracing.check_snapshot(Context(CUDA, tmp_path)).status == status
    monkeypatch.setattr(snapshot_record, "record_snapshot", lambda spec, p, overwrite: SimpleNamespace(
        status="oom", path=None, message="out of memory"))
    assert tracing.check_snapshot(Context(CUDA, tmp_path)).status == "fail"


def test_nvtx_fails_as_a_no_op(tmp_path, monkeypatch):
    ctx = Context(CUDA, tmp_path)
    monkeypatch.setattr(dev, "nvtx_range", lambda name: contextlib.nullcontext())
    assert timing.check_nvtx(ctx).status == "fail"
    monkeypatch.setattr(dev, "nvtx_range", lambda name: contextlib.suppress())
    assert timing.check_nvtx(ctx).status == "ok"


def test_flash_torch_fails_with_a_wrong_kernel(ctx, monkeypatch):
    from lmperf.kernels import flash_torch

    def anti_causal(q, k, v, causal):  # the mask the wrong way round
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=not causal)

    monkeypatch.setattr(flash_torch, "flash_attention_torch", anti_causal)
    assert numerics.check_flash_torch(ctx).status == "fail"


def _answer(ctx: Context, launch, answer) -> None:
    done: Future = Future()
    done.set_result(answer)
    ctx.launched[launch] = done


def test_flash_triton_fails_when_its_child_fails(ctx, monkeypatch):
    from lmperf.kernels import flash_triton

    monkeypatch.setattr(flash_triton, "triton_available", lambda: True)
    monkeypatch.setattr("lmperf.kernels.interpreter_gap", lambda: None)
    _answer(ctx, numerics.start_flash_triton,
            {"error": "the flash-triton child exited with 1: triton.CompilationError"})
    out = numerics.check_flash_triton(ctx)
    assert out.status == "fail" and "CompilationError" in out.result


def test_flash_triton_is_skipped_where_the_interpreter_cannot_run(ctx, monkeypatch):
    from lmperf.kernels import flash_triton

    monkeypatch.setattr(flash_triton, "triton_available", lambda: True)
    monkeypatch.setattr("lmperf.kernels.interpreter_gap", lambda: "Triton 3.6.0's interpreter")
    out = numerics.check_flash_triton(ctx)
    assert out.status == "skip" and "Triton 3.6.0" in out.why


def test_flash_triton_shapes_fail_beyond_a_bound(tmp_path, monkeypatch):
    from lmperf.kernels import flash_triton

    monkeypatch.setattr(flash_triton, "triton_available", lambda: True)
    ctx = Context(CUDA, tmp_path)
    case = {"max_abs_err": 0.0116, "sdpa_abs_err": 0.0119, "vs_sdpa": 0.0078, "atol": 0.03,
            "rtol": 0.03}
    _answer(ctx, numerics.start_flash_triton_shapes,
            {"dtypes": {"bf16 2x3x257x64": {**case, "worst_excess": -0.0257},
                        "bf16 1x2x1030x64 causal": {**case, "worst_excess": 0.004}}})
    out = numerics.check_flash_triton_shapes(ctx)
    assert out.status == "fail" and "beyond the bound: bf16 1x2x1030x64 causal" in out.result


def test_oom_snapshot_fails_without_a_dump(ctx, monkeypatch):
    # the observer armed, the allocation runs out of memory, and no snapshot is written
    monkeypatch.setattr(dev, "on_oom_dump", lambda device, path: True)
    for name in ("start_memory_history", "stop_memory_history"):
        monkeypatch.setattr(dev, name, lambda *a, **k: True)
    monkeypatch.setattr(dev, "device_memory_gib", lambda device: 139.8)

    def empty(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 147.80 GiB")

    monkeypatch.setattr(torch, "empty", empty)
    out = gpu.check_oom_snapshot(ctx)
    assert out.status == "fail" and out.why == "the observer must dump on out-of-memory"
