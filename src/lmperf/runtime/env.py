"""Capture of the environment a result was measured in."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from pathlib import Path

import torch

import lmperf
from lmperf.runtime import device as dev
from lmperf.runtime.peaks import is_mig


def git_commit() -> str | None:
    """The git commit of the lmperf source tree (with '-dirty' if it has changes), or None."""
    root = Path(__file__).resolve().parents[3]
    if not (root / ".git").exists():
        return None
    quiet = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}  # never take the index lock of a checkout
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=True, env=quiet).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5, env=quiet).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("-dirty" if dirty else "")


def capture(device: torch.device) -> dict:
    """Versions, device, CPU, threads, TF32 settings and a UTC timestamp, as a JSON-ready dict;
    on CUDA also the compute capability ("8.0"), whether the device is a MIG slice, the NCCL
    version and what NVML says (driver, clocks, power limit, ECC, temperature, other processes:
    `runtime.device.gpu_env`; absent on the CPU)."""
    return {
        "lmperf": lmperf.__version__,
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        **dev.cuda_versions(),
        "device": device.type,
        "device_name": dev.device_name(device),
        **_cuda_fields(device),
        **dev.gpu_environment(device),  # driver, NCCL, clocks, power, ECC, other processes
        "cpu_model": dev.cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        **dev.tf32_state(),
        "load_average_1m": _load_average(),
        "hostname": platform.node(),
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def _cuda_fields(device: torch.device) -> dict:
    """compute_capability and mig of a CUDA device (what decides bf16 support and the peak)."""
    capability = dev.cuda_capability(device)
    if capability is None:
        return {}
    return {"compute_capability": f"{capability[0]}.{capability[1]}",
            "mig": is_mig(dev.device_name(device))}


def _load_average() -> float | None:
    """The 1-minute load average: above the core count means runs competed for the CPU."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None
