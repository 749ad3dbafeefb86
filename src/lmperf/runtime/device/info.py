"""What the device is and can do: names, versions, capability, bf16, fused AdamW."""

from __future__ import annotations

import functools

import torch

from lmperf.runtime.device.select import cuda_index


def device_name(device: torch.device) -> str:
    """Marketing name of the GPU, or the CPU model name."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(cuda_index(device))
    return cpu_model()


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, or the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown CPU"


def cuda_versions() -> dict[str, str | None]:
    """CUDA runtime and cuDNN versions torch was built with (None on a CPU build)."""
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {"cuda": torch.version.cuda, "cudnn": str(cudnn) if cudnn else None}


def cuda_capability(device: torch.device) -> tuple[int, int] | None:
    """(major, minor) compute capability of a CUDA device; None for any other device."""
    if device.type != "cuda":
        return None
    return tuple(torch.cuda.get_device_capability(cuda_index(device)))  # type: ignore[return-value]


def bf16_supported(device: torch.device) -> bool:
    """Whether `device` does bf16 math natively: on CUDA, compute capability >= 8.0 (Ampere) of
    this very device; ROCm builds support bf16 on every device torch runs on; CPUs do.

    Not `torch.cuda.is_bf16_supported()`: by default it counts emulation (a pre-Ampere GPU that
    can merely hold a bf16 tensor answers True) and it asks about the current device, not this one.
    """
    if device.type != "cuda":
        return True
    if torch.version.hip:
        return True
    major, _ = cuda_capability(device)  # type: ignore[misc]
    return major >= 8


def fused_adamw_supported(device: torch.device) -> bool:
    """Whether `AdamW(fused=True)` runs on this device type (CUDA, and CPU since torch 2.4).

    torch's own list of devices with fused optimizer kernels answers without running anything
    (a probe step costs ~1.3 s of lazy imports, and would initialise CUDA in the caller); where
    that private helper is missing, one tiny fused step is tried.
    """
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        return device.type in _get_fused_kernels_supported_devices()
    except (ImportError, AttributeError):
        pass
    params = [torch.nn.Parameter(torch.zeros(2, device=device))]
    params[0].grad = torch.zeros(2, device=device)
    try:
        torch.optim.AdamW(params, fused=True).step()
    except (RuntimeError, ValueError, TypeError):
        return False
    return True


# FP8 tensor cores: Ada (sm_89) and Hopper (sm_90) on; torch._scaled_mm refuses older GPUs.
FP8_CAPABILITY = (8, 9)


def float8_unsupported_reason(device: torch.device, recipe: str) -> str | None:
    """Why torchao's float8 training with `recipe` ('tensorwise' or 'rowwise') cannot run on
    `device`, in one phrase; None when it can. torchao must be importable; on CUDA the device
    needs FP8 tensor cores (compute capability 8.9 or newer); elsewhere torch must run the
    recipe's scaled matmul (`torch._scaled_mm`, one tiny call tried once per process)."""
    import importlib.util

    if importlib.util.find_spec("torchao") is None:
        return "torchao is not installed (pip install 'lmperf[float8]')"
    if device.type == "cuda":
        cap = cuda_capability(device)
        if cap is not None and cap < FP8_CAPABILITY and not torch.version.hip:
            return (f"{device_name(device)} (sm_{cap[0]}{cap[1]}) has no FP8 tensor cores "
                    "(sm_89 and newer: Ada, Hopper, Blackwell)")
        return None
    return _scaled_mm_fails(device.type, recipe)


@functools.cache
def _scaled_mm_fails(device_type: str, recipe: str) -> str | None:
    """torch._scaled_mm of float8 (16, 32) x (32, 16) with the recipe's scales on this device
    type: None when it runs, else its error in one phrase."""
    a = torch.ones(16, 32, device=device_type).to(torch.float8_e4m3fn)
    b = torch.ones(16, 32, device=device_type).to(torch.float8_e4m3fn).t()  # column-major
    one = torch.ones((), device=device_type)
    scales = (one, one) if recipe == "tensorwise" else (
        torch.ones(16, 1, device=device_type), torch.ones(1, 16, device=device_type))
    try:
        torch._scaled_mm(a, b, scale_a=scales[0], scale_b=scales[1], out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError, TypeError, AttributeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        return (f"torch {torch.__version__} cannot run float8 scaled matmuls on the "
                f"{device_type} ({first})")
    return None
