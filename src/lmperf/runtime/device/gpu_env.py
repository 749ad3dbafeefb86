"""What a GPU record's environment needs beyond torch: the driver, NCCL, clocks, power limit, ECC,
temperature and the other processes on the device, read through NVML where the optional
`nvidia-ml-py` package (`import pynvml`) is installed.

Every field is read on its own (a consumer GPU refuses ECC: that field is None, the others
stay); without the package or a working binding the record says why (`nvml`) and capture goes
on. The NVML device is found by the CUDA device's UUID, never by index: NVML numbers GPUs in PCI
order and ignores CUDA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch

from lmperf.runtime.device.select import cuda_index
from lmperf.units import GIB

INSTALL_HINT = "pip install 'lmperf[gpu]' (nvidia-ml-py)"


def nccl_version() -> str | None:
    """The NCCL version torch was built with ("2.21.5"), or None (a CPU build, no NCCL)."""
    try:
        import torch.cuda.nccl as nccl

        version = nccl.version()
    except (ImportError, AttributeError, RuntimeError):
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _text(value: Any) -> str:
    """NVML strings: bytes in old pynvml releases, str in nvidia-ml-py."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _why(exc: BaseException) -> str:
    """'unavailable: ...' in one line: NVMLError's own text, the type too for anything else."""
    text = (_text(exc).strip().splitlines() or [""])[0]
    return f"unavailable: {text}" if "NVMLError" in type(exc).__name__ else (
        f"unavailable: {type(exc).__name__}: {text}")


def _handle(nvml: Any, device: torch.device) -> Any:
    """The NVML handle of the CUDA device `device`, by its UUID."""
    uuid = str(torch.cuda.get_device_properties(cuda_index(device)).uuid)
    names = [uuid] if uuid.startswith(("GPU-", "MIG-")) else [f"GPU-{uuid}", f"MIG-{uuid}"]
    for name in names:
        try:
            return nvml.nvmlDeviceGetHandleByUUID(name)
        except nvml.NVMLError:
            continue
    raise LookupError(f"NVML knows no device with UUID {uuid}")


def _fields(nvml: Any, handle: Any) -> dict[str, Any]:
    """The record's GPU fields from an NVML handle; a field NVML refuses is None."""

    def read(fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception:  # NVMLError_NotSupported, or an odd binding's own error
            return None

    def scaled(value: Any, factor: float) -> float | None:
        return None if value is None else value * factor

    cuda = read(nvml.nvmlSystemGetCudaDriverVersion)  # e.g. 12040 for 12.4
    ecc = read(nvml.nvmlDeviceGetEccMode, handle)  # [current, pending]
    # Newer NVML calls them clock event reasons, older ones throttle reasons (same bits).
    reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nvml, "nvmlDeviceGetCurrentClocksThrottleReasons")
    return {
        "driver_version": _text(d) if (d := read(nvml.nvmlSystemGetDriverVersion)) else None,
        "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
        "sm_clock_mhz": read(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
        "sm_clock_max_mhz": read(nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_SM),
        "memory_clock_mhz": read(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_MEM),
        "memory_clock_max_mhz": read(nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_MEM),
        "clock_event_reasons": read(reasons, handle),  # NVML bitmask, 0 or 1 (idle): not held back
        "power_limit_w": scaled(read(nvml.nvmlDeviceGetEnforcedPowerLimit, handle), 1e-3),
        "power_default_limit_w": scaled(
            read(nvml.nvmlDeviceGetPowerManagementDefaultLimit, handle), 1e-3),
        "temperature_c": read(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU),
        "ecc_enabled": bool(ecc[0] == nvml.NVML_FEATURE_ENABLED) if ecc else None,
        "other_processes": _others(read(nvml.nvmlDeviceGetComputeRunningProcesses, handle)),
    }


def _others(processes: list | None) -> list[dict[str, Any]] | None:
    """The compute processes on the device other than this one: pid and GiB used (None where
    NVML cannot tell, e.g. without the rights to see them)."""
    if processes is None:
        return None
    mine = os.getpid()
    return [{"pid": p.pid, "used_gib": p.usedGpuMemory / GIB if p.usedGpuMemory else None}
            for p in processes if p.pid != mine]


def gpu_environment(device: torch.device) -> dict[str, Any]:
    """The NCCL version and NVML's fields for `device` (see the module docstring), with `nvml`
    'ok' or why they are missing; {} for a device that is not CUDA."""
    if device.type != "cuda":
        return {}
    out: dict[str, Any] = {"nccl_version": nccl_version()}
    try:
        import pynvml as nvml
    except ImportError:
        return {**out, "nvml": f"unavailable: nvidia-ml-py is not installed ({INSTALL_HINT})"}
    except Exception as exc:  # a binding that fails while importing
        return {**out, "nvml": _why(exc)}
    # Broad catches: this runs before any record exists, and a binding may raise anything
    # (OSError from a library it cannot load, AttributeError from a pynvml of another era).
    try:
        nvml.nvmlInit()
    except Exception as exc:
        return {**out, "nvml": _why(exc)}
    try:
        return {**out, "nvml": "ok", **_fields(nvml, _handle(nvml, device))}
    except Exception as exc:
        return {**out, "nvml": _why(exc)}
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
