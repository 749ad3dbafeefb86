"""A GPU record's environment through NVML (issue 19, finding 9), with a faked `pynvml` module:
the field names and calls are nvidia-ml-py's (pynvml.py), the answers those of an A100 whose
ECC query is refused, with one other process on it."""

from __future__ import annotations

import os
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from lmperf.runtime import env as envmod
from lmperf.runtime.device import gpu_env

UUID = "2fe4c3f3-8c1a-4d7e-9b4e-0123456789ab"
GIB = 2**30


class NVMLError(Exception):
    pass


def fake_nvml(calls: list) -> types.ModuleType:
    """A pynvml stand-in that records its calls; ECC is 'not supported'."""
    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError
    m.NVML_CLOCK_SM, m.NVML_CLOCK_MEM, m.NVML_TEMPERATURE_GPU, m.NVML_FEATURE_ENABLED = 1, 2, 0, 1
    handle = object()

    def by_uuid(name):
        calls.append(("uuid", name))
        if name != f"GPU-{UUID}":
            raise NVMLError("Not Found")
        return handle

    def refuse(h):
        raise NVMLError("Not Supported")

    def clock(h, kind):
        assert h is handle
        return {1: 1410, 2: 1593}[kind]

    m.nvmlInit = lambda: calls.append("init")
    m.nvmlShutdown = lambda: calls.append("shutdown")
    m.nvmlDeviceGetHandleByUUID = by_uuid
    m.nvmlDeviceGetHandleByIndex = lambda i: pytest.fail("NVML indices are not CUDA's")
    m.nvmlSystemGetDriverVersion = lambda: b"550.54.15"  # bytes, as old pynvml returns
    m.nvmlSystemGetCudaDriverVersion = lambda: 12040
    m.nvmlDeviceGetClockInfo = clock
    m.nvmlDeviceGetMaxClockInfo = lambda h, kind: {1: 1410, 2: 1593}[kind]
    m.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: 0  # older name only
    m.nvmlDeviceGetEnforcedPowerLimit = lambda h: 400_000  # mW
    m.nvmlDeviceGetPowerManagementDefaultLimit = lambda h: 400_000
    m.nvmlDeviceGetTemperature = lambda h, sensor: 34
    m.nvmlDeviceGetEccMode = refuse
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        SimpleNamespace(pid=os.getpid(), usedGpuMemory=GIB),
        SimpleNamespace(pid=4242, usedGpuMemory=3 * GIB)]
    return m


@pytest.fixture
def a100(monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(calls))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index=None: SimpleNamespace(uuid=UUID, name="NVIDIA A100"))
    monkeypatch.setattr(gpu_env, "nccl_version", lambda: "2.21.5")
    return calls


def test_the_gpu_fields_come_from_nvml(a100):
    got = gpu_env.gpu_environment(torch.device("cuda", 0))
    assert got["nvml"] == "ok" and got["nccl_version"] == "2.21.5"
    assert got["driver_version"] == "550.54.15" and got["cuda_driver_version"] == "12.4"
    assert got["sm_clock_mhz"] == got["sm_clock_max_mhz"] == 1410
    assert got["memory_clock_mhz"] == 1593 and got["clock_event_reasons"] == 0
    assert got["power_limit_w"] == pytest.approx(400.0) and got["temperature_c"] == 34
    assert got["ecc_enabled"] is None  # refused: the other fields stay
    assert got["other_processes"] == [{"pid": 4242, "used_gib": 3.0}]  # this process left out
    assert a100[0] == "init" and a100[-1] == "shutdown"
    assert ("uuid", f"GPU-{UUID}") in a100


def test_without_the_package_the_record_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    monkeypatch.setattr(gpu_env, "nccl_version", lambda: "2.21.5")
    got = gpu_env.gpu_environment(torch.device("cuda", 0))
    assert got["nvml"].startswith("unavailable: nvidia-ml-py is not installed")
    assert got["nccl_version"] == "2.21.5" and "driver_version" not in got


def test_a_driver_nvml_cannot_reach_is_said(a100, monkeypatch):
    def broken():
        raise NVMLError("Driver Not Loaded")

    monkeypatch.setattr(sys.modules["pynvml"], "nvmlInit", broken)
    assert gpu_env.gpu_environment(torch.device("cuda", 0))["nvml"] == "unavailable: Driver Not Loaded"


def test_the_cpu_has_none_of_it(a100):
    assert gpu_env.gpu_environment(torch.device("cpu")) == {}
    captured = envmod.capture(torch.device("cpu"))
    assert "nvml" not in captured and "driver_version" not in captured and a100 == []


@pytest.mark.parametrize("where", ["nvmlInit", "nvmlDeviceGetHandleByUUID", "nvmlShutdown",
                                   "nvmlDeviceGetTemperature"])
def test_a_binding_raising_something_else_never_escapes(a100, monkeypatch, where):
    """An odd pynvml raises OSError (or anything) instead of NVMLError: capture still answers."""
    def odd(*args):
        raise OSError("libnvidia-ml.so.1: cannot open shared object file\nsecond line")

    monkeypatch.setattr(sys.modules["pynvml"], where, odd)
    got = gpu_env.gpu_environment(torch.device("cuda", 0))
    assert got["nccl_version"] == "2.21.5"
    if where in ("nvmlInit", "nvmlDeviceGetHandleByUUID"):
        assert got["nvml"] == "unavailable: OSError: libnvidia-ml.so.1: cannot open shared object file"
    else:  # a field refused, or a failed shutdown: the others stay
        assert got["nvml"] == "ok" and got["sm_clock_mhz"] == 1410
        assert got["temperature_c"] is (None if where == "nvmlDeviceGetTemperature" else 34)
