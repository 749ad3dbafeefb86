"""CUDA paths of the device layer, checked on the CPU against torch's own code.

torch.cuda's *Python* layer (device-index resolution, bf16 support, the memory fraction) runs
for real here; only the calls into the CUDA runtime (device properties, the current device, the
C++ setter) are replaced by stand-ins for a machine with given GPUs. Each test failed on the code
before issue 11: an index-less "cuda" device crashed the memory cap, bf16 was judged by the
current device with emulation counted, a MIG slice borrowed its GPU's peak, and two CUDA
out-of-memory messages were errors.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.cuda.memory

from lmperf.core.outcome import failure
from lmperf.runtime import device as dev
from lmperf.runtime import env as envmod
from lmperf.runtime import peaks
from lmperf.runtime.precision import get_regime, unsupported_reason

GIB = 2**30
# Two GPUs: index 0 an A100 (sm_80), index 1 a V100 (sm_70, bf16 only emulated).
GPUS = {0: SimpleNamespace(name="NVIDIA A100-SXM4-80GB", major=8, minor=0, total_memory=80 * GIB),
        1: SimpleNamespace(name="Tesla V100-SXM2-32GB", major=7, minor=0, total_memory=32 * GIB)}


@pytest.fixture
def gpus(monkeypatch):
    """A machine with GPUS, current device 0: `.current["index"]` selects the current device and
    `.fractions` lists the (fraction, index) pairs the memory cap set."""
    current = {"index": 0}
    fractions: list[tuple[float, int]] = []

    def props(device=None):
        if isinstance(device, str):
            device = torch.device(device)
        if isinstance(device, torch.device):
            device = device.index
        return GPUS[current["index"] if device is None else device]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current["index"])
    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: props(device).name)
    monkeypatch.setattr(torch.cuda, "_check_bf16_tensor_supported", lambda device: True)  # emulation
    monkeypatch.setattr(torch.cuda.memory, "_lazy_init", lambda: None)
    monkeypatch.setattr(torch._C, "_cuda_setMemoryFraction",
                        lambda fraction, index: fractions.append((fraction, index)), raising=False)
    monkeypatch.setattr(torch.version, "hip", None)
    return SimpleNamespace(current=current, fractions=fractions)


# --- finding 1: the memory cap on an index-less device ---------------------------------------------

def test_torch_refuses_an_index_less_device_for_the_fraction(gpus):
    # The premise, checked on torch itself: this is what crashed every capped CUDA child.
    with pytest.raises(ValueError, match="specified index"):
        torch.cuda.set_per_process_memory_fraction(0.5, torch.device("cuda"))


def test_cap_memory_on_plain_cuda_resolves_the_current_device(gpus):
    desc = dev.cap_memory(torch.device("cuda"), 20)
    assert gpus.fractions == [(pytest.approx(20 / 80), 0)]
    assert "20 GiB" in desc and "25.0%" in desc and "cuda:0" in desc


def test_cap_memory_uses_the_runs_device_not_the_current_one(gpus):
    dev.cap_memory(torch.device("cuda", 1), 16)
    assert gpus.fractions == [(pytest.approx(16 / 32), 1)]  # the V100's total, the V100's index


def test_cap_memory_fraction_is_a_float_at_most_one(gpus):
    dev.cap_memory(torch.device("cuda"), 500)  # more than the device has
    assert gpus.fractions == [(1.0, 0)] and isinstance(gpus.fractions[0][0], float)


def test_cuda_index(gpus):
    assert dev.cuda_index(torch.device("cuda", 1)) == 1
    assert dev.cuda_index(torch.device("cuda")) == 0
    gpus.current["index"] = 1
    assert dev.cuda_index(torch.device("cuda")) == 1
    with pytest.raises(ValueError):
        dev.cuda_index(torch.device("cpu"))


# --- finding 4: bf16 by the run's device's compute capability --------------------------------------

def test_bf16_on_a_pre_ampere_gpu_is_not_supported_though_torch_says_so(gpus):
    gpus.current["index"] = 1
    assert torch.cuda.is_bf16_supported() is True  # emulation counted: the trap
    assert dev.bf16_supported(torch.device("cuda")) is False
    assert dev.bf16_supported(torch.device("cuda", 1)) is False


def test_bf16_is_judged_on_the_runs_device_not_the_current_one(gpus):
    assert gpus.current["index"] == 0  # the A100 is current
    assert dev.bf16_supported(torch.device("cuda", 1)) is False
    assert dev.bf16_supported(torch.device("cuda", 0)) is True
    assert dev.bf16_supported(torch.device("cuda")) is True


def test_bf16_regime_is_unsupported_on_the_v100(gpus):
    why = unsupported_reason(get_regime("bf16-mixed"), torch.device("cuda", 1))
    assert why and "bf16" in why and "V100" in why
    assert unsupported_reason(get_regime("bf16-mixed"), torch.device("cuda", 0)) is None


def test_bf16_on_rocm_is_supported(gpus, monkeypatch):
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert dev.bf16_supported(torch.device("cuda", 1)) is True


def test_cuda_capability(gpus):
    assert dev.cuda_capability(torch.device("cuda", 1)) == (7, 0)
    assert dev.cuda_capability(torch.device("cpu")) is None


def test_env_records_capability_and_mig(gpus, monkeypatch):
    monkeypatch.setattr(GPUS[1], "name", "NVIDIA A100-SXM4-40GB MIG 1g.5gb")
    env = envmod.capture(torch.device("cuda", 1))
    assert env["compute_capability"] == "7.0" and env["mig"] is True
    assert env["device_name"].endswith("MIG 1g.5gb")
    assert "compute_capability" not in envmod.capture(torch.device("cpu"))


# --- finding 5: a MIG slice gets no peak ------------------------------------------------------------

MIG_NAMES = ["NVIDIA A100-SXM4-40GB MIG 1g.5gb", "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
             "NVIDIA H100 80GB HBM3 MIG 7g.80gb", "NVIDIA H100 PCIe MIG 1g.10gb",
             "A100-SXM4-40GB MIG 4c.7g.40gb", "NVIDIA H200 MIG 1g.18gb"]


@pytest.mark.parametrize("name", MIG_NAMES)
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "tf32", "fp32"])
def test_a_mig_slice_gets_no_peak(name, dtype):
    assert peaks.lookup_peak(name, dtype) is None
    assert peaks.is_mig(name)
    assert peaks.peak_key(name) is None


@pytest.mark.parametrize("name,key", [("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),
                                      ("NVIDIA H100 80GB HBM3", "H100"),
                                      ("NVIDIA H100 PCIe", "H100 PCIe"),
                                      ("NVIDIA H100 NVL", "H100 NVL"),
                                      ("NVIDIA GeForce RTX 4090", "RTX 4090")])
def test_whole_gpus_keep_their_entry(name, key):
    assert not peaks.is_mig(name)
    assert peaks.peak_key(name) == key


@pytest.mark.parametrize("name", ["NVIDIA AMIGA 9000", "NVIDIA A100 MIGHTY"])
def test_mig_must_be_a_word(name):
    assert not peaks.is_mig(name)


def test_a_slice_in_the_table_gets_its_own_peak(monkeypatch):
    slice_peak = peaks.Peak(44.6, "a test's figure for one slice")
    monkeypatch.setattr(peaks, "PEAKS", [("A100-SXM4-40GB MIG 1g.5gb", {"bf16": slice_peak}),
                                         *peaks.PEAKS])
    assert peaks.lookup_peak("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "bf16") is slice_peak
    assert peaks.lookup_peak("NVIDIA A100-SXM4-40GB MIG 2g.10gb", "bf16") is None
    assert peaks.lookup_peak("NVIDIA A100-SXM4-40GB", "bf16").tflops == 312.0  # the whole GPU: family


# --- finding 6: CUDA out-of-memory messages that are not torch.OutOfMemoryError ----------------------

OOM_MESSAGES = [
    "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other "
    "API call, so the stacktrace below might be incorrect.",
    "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasLtMatmul(...)`",
    "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
    "cusolver error: CUSOLVER_STATUS_ALLOC_FAILED, when calling `cusolverDnCreate(handle)`",
    "HIP error: out of memory",
]


@pytest.mark.parametrize("text", OOM_MESSAGES)
def test_cuda_library_and_runtime_allocation_failures_are_oom(text):
    assert dev.is_oom(RuntimeError(text))
    accelerator_error = getattr(torch, "AcceleratorError", None)  # torch >= 2.8 raises this one
    if accelerator_error is not None:
        assert dev.is_oom(accelerator_error(text))
    assert failure(RuntimeError(text), "running the step")["status"] == "oom"


@pytest.mark.parametrize("text", [
    "CUDA error: an illegal memory access was encountered",
    "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm(...)`",
    "CUDA error: device-side assert triggered",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED",
])
def test_other_cuda_errors_stay_errors(text):
    assert not dev.is_oom(RuntimeError(text))
    assert failure(RuntimeError(text), "running the step")["status"] == "error"


def test_oom_words_in_a_non_runtime_error_are_not_oom():
    assert not dev.is_oom(ValueError("CUDA error: out of memory"))
