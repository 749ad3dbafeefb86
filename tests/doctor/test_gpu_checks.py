"""The doctor's GPU-path checks (issue 19): listed and skipped with their reason on this CPU, and
each one's judgement exercised with fakes at the device layer (no GPU here); the 2-rank gloo
job's verdicts from fabricated records (the real launch runs in test_cli's whole doctor)."""

from __future__ import annotations

from concurrent.futures import Future

import pytest
import torch

import lmperf
from lmperf.questions.doctor import distjob, gpu, numerics, registry
from lmperf.questions.doctor.checks import Context
from lmperf.runtime import device as dev

CPU = torch.device("cpu")
NEW_CUDA = ["flash-triton shapes, fp16/bf16 (compiled)", "TF32 regimes change cuBLAS results",
            "per-call timer (lmperf attention)", "out-of-memory snapshot dump",
            "NCCL collectives vs reference (2+ GPUs)", "1 step per strategy = 1 process (NCCL)",
            "memory cap per rank (NCCL)"]
NEW_CPU = ["collectives vs reference (gloo, 2 ranks)", "1 step per strategy = 1 process (gloo)"]


@pytest.mark.skipif(dev.cuda_available(), reason="the CPU machine's acceptance")
def test_every_new_gpu_check_is_listed_and_skipped_with_its_reason():
    assert set(NEW_CUDA + NEW_CPU) <= set(registry.NAMES)
    report = lmperf.doctor("auto", checks=NEW_CUDA)
    rows = report.frame.to_dict("records")
    assert [r["check"] for r in rows] == NEW_CUDA
    for row in rows:
        assert row["status"] == "skip" and row["device"] == "cuda", row
        assert row["why"].startswith("no CUDA device: "), row


def _answer(ctx: Context, answer) -> None:
    """The torchrun launch's answer, as if it had run in this job."""
    done: Future = Future()
    done.set_result(answer)
    ctx.launched[distjob.start] = done


# --- the distributed job ------------------------------------------------------------------------

def test_plan_cpu_is_two_gloo_ranks_and_cuda_needs_two_gpus(monkeypatch):
    job = distjob.plan(CPU)
    assert isinstance(job, distjob.DistCheck) and job.world_size == 2 and job.backend == "gloo"
    assert job.items() == ["collectives", "strategies"] and job.max_memory_gib == 0
    monkeypatch.setattr(dev, "cuda_device_count", lambda: 1)
    assert distjob.plan(torch.device("cuda")).startswith("needs 2 or more GPUs (this machine has 1)")
    monkeypatch.setattr(dev, "cuda_device_count", lambda: 4)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    job = distjob.plan(torch.device("cuda"))
    assert (job.world_size, job.backend, job.device) == (4, "nccl", "cuda")
    assert "memory-cap" in job.items() and job.max_memory_gib == distjob.CAP_GIB
    assert distjob.DistCheck.from_dict(job.to_dict()) == job


def test_a_reason_instead_of_a_job_is_a_skip_row(ctx):
    _answer(ctx, "needs 2 or more GPUs (this machine has 1): one NCCL rank per GPU")
    for check in (distjob.check_collectives, distjob.check_strategies, distjob.check_memory_cap):
        out = check(ctx)
        assert out.status == "skip" and out.why.startswith("needs 2 or more GPUs")


def _record(item: str, ranks: list, status: str = "ok") -> dict:
    return {"spec": {"item": item}, "status": status, "message": "", "env": {"backend": "nccl"},
            "metrics": {"ranks": ranks}}


def test_one_wrong_collective_on_one_rank_fails_naming_it(ctx):
    good = {"all_reduce 4 KiB": True, "broadcast 16 MiB": True}
    _answer(ctx, {"collectives": _record("collectives", [good, good])})
    assert distjob.check_collectives(ctx).status == "ok"
    _answer(ctx, {"collectives": _record("collectives", [good, {**good, "broadcast 16 MiB": False}])})
    out = distjob.check_collectives(ctx)
    assert out.status == "fail" and "broadcast 16 MiB (rank 1)" in out.result


def test_a_rank_capped_on_another_gpu_fails(ctx):
    # issue 19 finding 1: every rank's cap landing on GPU 0 leaves rank 1 uncapped on GPU 1
    capped = [{"device_index": r, "local_rank": r, "small_ok": True, "big_oom": True, "message": "oom"}
              for r in range(2)]
    _answer(ctx, {"memory-cap": _record("memory-cap", capped)})
    assert distjob.check_memory_cap(ctx).status == "ok"
    uncapped = {"device_index": 1, "local_rank": 1, "small_ok": True, "big_oom": False,
                "message": "allocated 3 GiB on cuda:1 under the cap"}
    _answer(ctx, {"memory-cap": _record("memory-cap", [capped[0], uncapped])})
    out = distjob.check_memory_cap(ctx)
    assert out.status == "fail" and "rank 1" in out.result and "allocated 3 GiB" in out.result


def test_strategies_fail_beyond_the_bound(ctx):
    def result(diff):
        return {"equal": diff < 1e-5, "max_abs_diff": diff, "worst": "a.weight"}

    fine = {"naive": result(1e-7), "zero1": result(0.0)}
    _answer(ctx, {"strategies": _record("strategies", [fine, fine])})
    assert distjob.check_strategies(ctx).status == "ok"
    _answer(ctx, {"strategies": _record("strategies", [{**fine, "naive": result(1e-3)}])})
    out = distjob.check_strategies(ctx)
    assert out.status == "fail" and "beyond the bound: naive" in out.result


def test_a_crashed_item_is_a_fail_row_with_its_message(ctx):
    _answer(ctx, {"collectives": {"spec": {"item": "collectives"}, "status": "error",
                                       "message": "rank 1: NCCL error: unhandled system error"}})
    out = distjob.check_collectives(ctx)
    assert out.status == "fail" and "NCCL error" in out.result
    _answer(ctx, {})
    assert distjob.check_strategies(ctx).status == "fail"


# --- the GPU checks' judgements, with the device layer faked --------------------------------------

def test_flash_triton_shapes_say_why_not_on_the_cpu(ctx):
    out = numerics.check_flash_triton_shapes(ctx)
    assert out.status == "skip" and ("interpreter" in out.why or "not installed" in out.why)
    cases = numerics.sweep_cases(CPU)  # the CPU has native bf16: the long causal case is there
    assert {c[1] for c in cases} == set(numerics.SHAPES) | {numerics.LONG_BF16}
    assert {str(c[2]) for c in cases} == {"torch.float32", "torch.float16", "torch.bfloat16"}


def test_flash_triton_shapes_compare_what_the_launch_search_chose(monkeypatch):
    # The long bf16 causal case runs inside searching(): each kernel's search (faked here as
    # flash-triton's launches call it) chooses `fast`, and that is the launch the case records;
    # the other cases ran their defaults. Before: no search, no record of the launches.
    from lmperf.kernels import flash_configs as fc

    monkeypatch.setattr(fc, "CHOSEN", {})
    monkeypatch.setattr(fc, "SEARCHES", [])
    fast = fc.TileConfig(128, 64, 8, 3)

    def compare(fn, device, dtype, shape, causal_only):
        (b, h, n, d), causal = shape, (True,) if causal_only else (False, True)
        for kernel, c in ((k, c) for c in causal for k in fc.KERNELS):
            fc.choose(fc.search_key(kernel, b * h, n, n, d, dtype, c),
                      fc.default_config(kernel, dtype, d), lambda cfg: 1.0, lambda: [fast])
        return {"worst_excess": -1.0}

    monkeypatch.setattr(numerics, "compare_with_sdpa", compare)
    cases = numerics._child("cpu", "shapes")["dtypes"]
    long = cases.pop("bf16 " + "x".join(map(str, numerics.LONG_BF16)) + " causal")
    assert long["configs"] == dict.fromkeys(fc.KERNELS, fast.label())
    assert [(r["kernel"], r["chosen"]) for r in long["autotune"]] == [
        (k, fast.label()) for k in fc.KERNELS]
    d64 = {k: fc.default_config(k, torch.float32, 64).label() for k in fc.KERNELS}
    assert cases["fp32 2x3x257x64"]["configs"] == d64 and len(cases) == 6
    assert all("autotune" not in c and fast.label() not in c["configs"].values()
               for c in cases.values())


def test_tf32_that_changes_nothing_on_sm80_fails(ctx, monkeypatch):
    monkeypatch.setattr(gpu, "TF32_N", 64)
    monkeypatch.setattr(dev, "cuda_capability", lambda device: (8, 0))
    out = gpu.check_tf32(ctx)  # the CPU ignores the TF32 setting: both regimes agree
    assert out.status == "fail" and out.values["errors"]["tf32"] == out.values["errors"]["fp32"]
    monkeypatch.setattr(dev, "cuda_capability", lambda device: (7, 0))
    assert gpu.check_tf32(ctx).status == "ok"  # no TF32 below sm_80: no change is right


def test_call_timer_far_from_the_host_clock_fails(ctx, monkeypatch):
    monkeypatch.setattr(gpu, "TIMER_N", 32)
    monkeypatch.setattr(dev, "time_cuda_calls", lambda fn, device, warmup, repeats: [50.0] * repeats)
    out = gpu.check_call_timer(ctx)  # 50 ms per call against microseconds on the host clock
    assert out.status == "fail" and out.values["host_ms"] < 50


def test_oom_dump_without_the_hook_is_skipped(ctx):
    out = gpu.check_oom_snapshot(ctx)  # the CPU: on_oom_dump refuses
    assert out.status == "skip" and "observer" in out.why
