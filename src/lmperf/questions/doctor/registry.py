"""The doctor's checks, in the order of the table: the machine, then the CPU's paths, then
CUDA's. A check's name says which path it exercises; its scope which device it needs."""

from __future__ import annotations

from functools import partial

from lmperf.questions.doctor import capjob, ceilings, environment, numerics, precision, timing, tracing
from lmperf.questions.doctor import distjob, gpu, lowp
from lmperf.questions.doctor.checks import Check

CHECKS: tuple[Check, ...] = (
    Check("versions and env capture", "any", environment.check_versions),
    Check("peak table entry", "any", environment.check_peak_table),
    Check("nsys on PATH", "any", tracing.check_nsys),
    # The CPU's paths.
    Check("phase timing (host clock)", "cpu", timing.check_phase_clock),
    Check("measured ceilings (roofline)", "cpu", ceilings.check_ceilings),
    Check("peak RSS per phase", "cpu", timing.check_cpu_peaks),
    Check("memory cap -> oom row (cpu)", "cpu",
          partial(capjob.check_cap, name="memory cap -> oom row (cpu)"), capjob.start_cap_job),
    Check("autocast dtypes (cpu)", "cpu", precision.check_autocast),
    Check("low-precision matmul speed (cpu)", "cpu", lowp.check_lowp_matmuls),
    Check("GradScaler disabled path", "cpu", precision.check_scaler_disabled),
    Check("profiled step, ops by phase", "cpu", tracing.check_profile_cpu),
    Check("flash-torch vs SDPA (cpu)", "cpu", numerics.check_flash_torch),
    Check("flash-triton vs SDPA (interpreter)", "cpu",
          partial(numerics.check_flash_triton, name="flash-triton vs SDPA (interpreter)"),
          numerics.start_flash_triton),
    Check("collectives vs reference (gloo, 2 ranks)", "cpu",
          partial(distjob.check_collectives, name="collectives vs reference (gloo, 2 ranks)"),
          distjob.start),
    Check("1 step per strategy = 1 process (gloo)", "cpu",
          partial(distjob.check_strategies, name="collectives vs reference (gloo, 2 ranks)")),
    # CUDA's paths.
    Check("CUDA device", "cuda", environment.check_cuda_device),
    Check("synchronize", "cuda", timing.check_synchronize),
    Check("measured ceilings (roofline, cuda)", "cuda", ceilings.check_ceilings),
    Check("phase timing (CUDA events)", "cuda", timing.check_phase_clock),
    Check("allocator peaks per phase", "cuda", timing.check_cuda_peaks),
    Check("memory cap -> oom row (cuda)", "cuda",
          partial(capjob.check_cap, name="memory cap -> oom row (cuda)"), capjob.start_cap_job),
    Check("autocast dtypes (cuda)", "cuda", precision.check_autocast),
    Check("low-precision matmul speed (cuda)", "cuda", lowp.check_lowp_matmuls),
    Check("GradScaler + fused AdamW", "cuda", precision.check_scaler_fused),
    Check("profiled step, kernels by phase", "cuda", tracing.check_profile_cuda),
    Check("memory snapshot", "cuda", tracing.check_snapshot),
    Check("NVTX ranges", "cuda", timing.check_nvtx),
    Check("flash-torch vs SDPA (cuda)", "cuda", numerics.check_flash_torch),
    Check("flash-triton vs SDPA (compiled)", "cuda",
          partial(numerics.check_flash_triton, name="flash-triton vs SDPA (compiled)"),
          numerics.start_flash_triton),
    Check("flash-triton shapes, fp16/bf16 (compiled)", "cuda",
          partial(numerics.check_flash_triton_shapes,
                  name="flash-triton shapes, fp16/bf16 (compiled)"),
          numerics.start_flash_triton_shapes),
    Check("TF32 regimes change cuBLAS results", "cuda", gpu.check_tf32),
    Check("per-call timer (lmperf attention)", "cuda", gpu.check_call_timer),
    Check("bf16 GEMM vs peak table", "cuda", gpu.check_gemm_peak),
    Check("out-of-memory snapshot dump", "cuda", gpu.check_oom_snapshot),
    Check("nsys capture + parse", "cuda", tracing.check_nsys_capture),
    Check("NCCL collectives vs reference (2+ GPUs)", "cuda",
          partial(distjob.check_collectives, name="NCCL collectives vs reference (2+ GPUs)"),
          distjob.start),
    Check("1 step per strategy = 1 process (NCCL)", "cuda",
          partial(distjob.check_strategies, name="NCCL collectives vs reference (2+ GPUs)")),
    Check("memory cap per rank (NCCL)", "cuda",
          partial(distjob.check_memory_cap, name="NCCL collectives vs reference (2+ GPUs)")),
)
NAMES: tuple[str, ...] = tuple(c.name for c in CHECKS)
