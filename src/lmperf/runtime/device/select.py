"""Which device a run uses: resolving --device, the GPU count, the current device, synchronisation
and NVTX ranges."""

from __future__ import annotations

import contextlib

import torch

from lmperf.errors import SpecError


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available else cpu; 'cuda' without a GPU raises SpecError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda"):
        raise SpecError(f"unknown device {name!r}; accepted: auto, cpu, cuda")
    if name == "cuda" and not torch.cuda.is_available():
        raise SpecError("--device cuda was asked for, but torch sees no CUDA device here")
    return torch.device(name)


def cuda_device_count() -> int:
    """GPUs this process may use (torch respects CUDA_VISIBLE_DEVICES); 0 without CUDA."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def use_cuda_device(index: int) -> torch.device:
    """Make GPU `index` this process's current device (one GPU per local rank: NCCL needs it
    set before its first use); returns it."""
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    return device


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (for experiments that compare CPU and CUDA side by side)."""
    return torch.cuda.is_available()


def nvtx_range(name: str) -> contextlib.AbstractContextManager:
    """An NVTX range for Nsight Systems, or a no-op where NVTX is not usable (e.g. a CPU build,
    whose `torch.cuda.nvtx` raises)."""
    if not torch.cuda.is_available():
        return contextlib.nullcontext()
    try:
        return torch.cuda.nvtx.range(name)
    except (RuntimeError, AttributeError):
        return contextlib.nullcontext()


def cuda_index(device: torch.device) -> int:
    """The CUDA device index of `device`: its own, else the current device's.

    Some torch.cuda functions resolve an index-less `torch.device("cuda")` themselves
    (`_get_device_index(device, optional=True)`: synchronize, the memory statistics,
    get_device_properties), but `set_per_process_memory_fraction` does not and raises
    ValueError for it (torch/cuda/memory.py, torch 2.4 to 2.13). Every call here passes this
    index, so all of them address the same device.
    """
    if device.type != "cuda":
        raise ValueError(f"cuda_index needs a CUDA device, got {device}")
    return device.index if device.index is not None else torch.cuda.current_device()


def synchronize(device: torch.device) -> None:
    """Wait for all queued work on the device (a no-op on the CPU, where ops are synchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(cuda_index(device))
