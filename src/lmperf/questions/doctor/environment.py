"""What this machine is: versions and the environment capture every record carries, the CUDA
device's capabilities, and the peak-FLOP/s table's entry for this device (what MFU divides by)."""

from __future__ import annotations

import importlib.metadata
import json
import math

import torch

from lmperf.questions.doctor.checks import Context, Outcome, fail, ok, passed, skip
from lmperf.runtime import device as dev


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_versions(ctx: Context) -> Outcome:
    """torch, lmperf, Python and Triton versions, and `runtime.env.capture` for this device:
    every field a record's `env` needs, JSON-ready."""
    import lmperf
    from lmperf.runtime import env as envmod

    captured = envmod.capture(ctx.device)
    needed = {"lmperf", "torch", "python", "device", "device_name", "cpu_model", "torch_threads",
              "float32_matmul_precision", "timestamp"}
    missing = sorted(needed - set(captured))
    json.dumps(captured, allow_nan=False)  # raises if a value is not JSON-ready
    triton = _version("triton")
    cuda = f"CUDA {captured['cuda']}" if captured.get("cuda") else "CPU build"
    commit = captured.get("git_commit")
    result = (f"torch {torch.__version__} ({cuda}), lmperf {lmperf.__version__}, "
              f"Python {captured['python']}, Triton {triton or 'not installed'}"
              + (f", git {commit[:12]}{'-dirty' if commit.endswith('-dirty') else ''}"
                 if commit else ""))
    if missing:
        return fail(result, f"env capture lacks {', '.join(missing)}")
    return ok(result, f"every record's env: {len(captured)} fields, JSON-ready",
              env=captured, triton=triton)


def check_cuda_device(ctx: Context) -> Outcome:
    """The GPU: name, compute capability, memory, whether bf16 is native here and whether
    AdamW(fused=True) runs (lmperf's default optimizer on CUDA)."""
    from lmperf.runtime.peaks import is_mig

    device = ctx.device
    name = dev.device_name(device)
    major, minor = dev.cuda_capability(device) or (0, 0)
    total = dev.device_memory_gib(device)
    bf16 = dev.bf16_supported(device)
    fused = dev.fused_adamw_supported(device)
    mig = is_mig(name)
    result = (f"{name}: sm_{major}{minor}, {total:.1f} GiB, bf16 "
              f"{'native' if bf16 else 'not native'}, fused AdamW {'yes' if fused else 'no'}"
              + (", a MIG slice" if mig else ""))
    return passed(fused, result, "fused AdamW must run on CUDA (bf16 regimes are unsupported "
                                 "below sm_80)", name=name, capability=f"{major}.{minor}",
                  memory_gib=total, bf16_native=bf16, mig=mig)


MEMORY_SHARE = (0.85, 1.0)
"""CUDA's total memory over the entry's datasheet capacity: ECC and the driver's reserve take a
little (H200: 139.8 of 141 GiB, T4: 14.7 of 16); outside, the name matched another variant's
entry (an H100 NVL's 94 GB under the 80 GB H100's figures)."""


def check_peak_table(ctx: Context) -> Outcome:
    """The peak table's entry for this device name (MFU's denominator): the CPU has none, a MIG
    slice has none unless the table lists it, a known GPU has its datasheet figures, positive
    and in the order of its units (fp32 FMA <= tf32 <= bf16, fp32 <= fp16), and a capacity
    that CUDA's total memory matches (`MEMORY_SHARE`)."""
    from lmperf.runtime.peaks import PEAKS, is_mig, lookup_peak, peak_key, spec_for_device_name

    device = ctx.device
    name = dev.device_name(device)
    if device.type != "cuda":
        return ok("no entry for a CPU", "MFU is null on a CPU by design (GPU datasheet peaks "
                                        "only)", device_name=name)
    key = peak_key(name)
    if key is None:
        why = (f"{name} is a MIG slice and the table has no entry for it" if is_mig(name)
               else f"{name} matches no entry of runtime/peaks.py")
        return skip(f"{why}: MFU will be null (a device never borrows another's peak)",
                    result="no entry", mig=is_mig(name))
    table = dict(PEAKS)[key]
    if not table:
        return ok(f"'{key}': listed without figures", "its peaks differ from its family's, so "
                                                      "MFU is null rather than borrowed")
    figures = {d: lookup_peak(name, d).tflops for d in table}
    chain = [figures[d] for d in ("fp32", "tf32", "bf16") if d in figures]
    spec, total = spec_for_device_name(name), dev.device_memory_gib(device)
    share = total / spec.memory_gib if spec is not None and total else None
    low, high = MEMORY_SHARE
    result = (f"'{key}': " + ", ".join(f"{d} {v:g}" for d, v in figures.items()) + " TFLOP/s"
              + (f"; CUDA reports {total:.1f} of its {spec.memory_gib:g} GiB" if share else ""))
    good = (min(figures.values()) > 0 and chain == sorted(chain)
            and figures.get("fp16", math.inf) >= figures.get("fp32", 0)
            and (share is None or low <= share <= high))
    return passed(good, result, f"{next(iter(table.values())).source}; figures positive, fp32 <= "
                  f"tf32 <= bf16, fp32 <= fp16; CUDA's memory {low:.0%}-{high:.0%} of the "
                  "entry's", entry=key, tflops=figures, memory_share=share)
