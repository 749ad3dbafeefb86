"""The doctor's checks: each path once, with the name of its row under each scope it runs on.

The rows come out in the table's order per scope: the machine ('any'), then the CPU's paths,
then CUDA's. A row's name says which path it exercises; its scope which device it needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from lmperf.questions.doctor import capjob, ceilings, distjob, environment, gpu, lowp, numerics
from lmperf.questions.doctor import precision, timing, tracing
from lmperf.questions.doctor.checks import SCOPES, Check, Context, Outcome


@dataclass(frozen=True)
class Entry:
    """One path the doctor checks: the function, its row's name per scope ('' where it does
    not run), and what it launches (`Check.launches`)."""

    run: Callable[[Context], Outcome]
    any: str = ""
    cpu: str = ""
    cuda: str = ""
    launches: str = ""


ENTRIES: tuple[Entry, ...] = (
    Entry(environment.check_versions, any="versions and env capture"),
    Entry(environment.check_peak_table, any="peak table entry"),
    Entry(environment.check_cuda_device, cuda="CUDA device"),
    Entry(timing.check_phase_clock, cpu="phase timing (host clock)",
          cuda="phase timing (CUDA events)"),
    Entry(ceilings.check_ceilings, cpu="measured ceilings (roofline)",
          cuda="measured ceilings (roofline, cuda)"),
    Entry(timing.check_cpu_peaks, cpu="peak RSS per phase"),
    Entry(timing.check_cuda_peaks, cuda="allocator peaks per phase"),
    Entry(capjob.check_cap, cpu="memory cap -> oom row (cpu)", cuda="memory cap -> oom row (cuda)",
          launches="a capped child"),
    Entry(precision.check_autocast, cpu="autocast dtypes (cpu)", cuda="autocast dtypes (cuda)"),
    Entry(lowp.check_lowp_matmuls, cpu="low-precision matmul speed (cpu)",
          cuda="low-precision matmul speed (cuda)"),
    Entry(precision.check_scaler_disabled, cpu="GradScaler disabled path"),
    Entry(precision.check_scaler_fused, cuda="GradScaler + fused AdamW"),
    Entry(tracing.check_profile, cpu="profiled step, ops by phase",
          cuda="profiled step, kernels by phase"),
    Entry(tracing.check_snapshot, cuda="memory snapshot"),
    Entry(timing.check_nvtx, cuda="NVTX ranges"),
    Entry(numerics.check_flash_torch, cpu="flash-torch vs SDPA (cpu)",
          cuda="flash-torch vs SDPA (cuda)"),
    Entry(numerics.check_flash_triton, cpu="flash-triton vs SDPA (interpreter)",
          cuda="flash-triton vs SDPA (compiled)", launches="a Triton child"),
    Entry(numerics.check_flash_triton_shapes, cuda="flash-triton shapes, fp16/bf16 (compiled)",
          launches="a Triton child (shapes)"),
    Entry(gpu.check_tf32, cuda="TF32 regimes change cuBLAS results"),
    Entry(gpu.check_call_timer, cuda="per-call timer (lmperf attention)"),
    Entry(gpu.check_oom_snapshot, cuda="out-of-memory snapshot dump"),
    # One torchrun launch answers the distributed checks (distjob.start): they share a job.
    Entry(distjob.check_collectives, cpu="collectives vs reference (gloo, 2 ranks)",
          cuda="NCCL collectives vs reference (2+ GPUs)", launches="torchrun"),
    Entry(distjob.check_strategies, cpu="1 step per strategy = 1 process (gloo)",
          cuda="1 step per strategy = 1 process (NCCL)", launches="torchrun"),
    Entry(distjob.check_memory_cap, cuda="memory cap per rank (NCCL)", launches="torchrun"),
)

LAUNCH_ORDER: tuple[str, ...] = ("torchrun", "a Triton child (shapes)", "a Triton child",
                                 "a capped child")
"""The jobs that launch processes start first, longest first (torchrun's 2 ranks 18-28 s on the
2-core VM, Triton's interpreter 11-12 s, the capped child twice 9-14 s): the doctor then takes
about the torchrun launch plus the warm server's start."""

CHECKS: tuple[Check, ...] = tuple(Check(getattr(p, scope), scope, p.run, p.launches)
                                  for scope in SCOPES for p in ENTRIES if getattr(p, scope))
NAMES: tuple[str, ...] = tuple(c.name for c in CHECKS)
