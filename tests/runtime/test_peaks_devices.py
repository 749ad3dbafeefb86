"""The device table behind `--gpu NAME`: names, units, sources and CUDA-name matching."""

from __future__ import annotations

import pytest

from lmperf.errors import SpecError
from lmperf.runtime.peaks import (DEVICES, DTYPES, DeviceSpec, device_spec, lookup_peak,
                                  peak_key, require_device, spec_for_device_name)

# What the issue asks the table to hold, under the names `--gpu` accepts.
ASKED = ("B200", "H100-SXM", "H100-PCIe", "H200", "A100-40GB", "A100-80GB", "L4", "L40S",
         "A10G", "RTX-4090", "RTX-3090", "T4", "V100-SXM2-32GB", "MI300X")


@pytest.mark.parametrize("name", ASKED)
def test_every_asked_device_is_listed_with_sources(name: str) -> None:
    spec = DEVICES[name]
    assert isinstance(spec, DeviceSpec) and spec.name == name
    assert spec.memory_gib > 0 and spec.memory_bandwidth > 1e11 and spec.link_bandwidth > 1e9
    assert spec.source and spec.interconnect
    for dtype, peak in spec.peaks.items():
        assert dtype in DTYPES and peak.tflops > 0 and peak.source


@pytest.mark.parametrize("name, gib, bandwidth, link, bf16", [
    ("B200", 180, 8e12, 900e9, 2250.0),      # HGX B200: 1.4 TB, 64 TB/s, 36 PFLOPS sparse / 8
    ("H200", 141, 4.8e12, 450e9, 989.4),     # its own memory, the H100's compute
    ("H100-SXM", 80, 3.35e12, 450e9, 989.4),
    ("A100-40GB", 40, 1.555e12, 300e9, 312.0),
    ("A100-80GB", 80, 2.039e12, 300e9, 312.0),
    ("L4", 24, 300e9, 32e9, 121.0),          # 242 TFLOPS with sparsity
    ("RTX-4090", 24, 1008e9, 32e9, 165.2),   # fp32 accumulate, not the 330 of fp16 accumulate
    ("MI300X", 192, 5.3e12, 448e9, 1307.4),
])
def test_datasheet_figures(name: str, gib: float, bandwidth: float, link: float,
                           bf16: float) -> None:
    spec = DEVICES[name]
    assert (spec.memory_gib, spec.memory_bandwidth, spec.link_bandwidth) == (gib, bandwidth, link)
    assert spec.peak_tflops("bf16") == bf16


def test_dtypes_a_device_lacks_have_no_peak() -> None:
    # Turing and Volta have no bf16 or tf32 tensor cores; no dense A10G figure is published
    for name in ("T4", "V100-SXM2-32GB"):
        assert DEVICES[name].peak_tflops("bf16") is None
        assert DEVICES[name].peak_tflops("tf32") is None
        assert DEVICES[name].peak_tflops("fp16") > DEVICES[name].peak_tflops("fp32")
    assert DEVICES["A10G"].peaks == {} and DEVICES["A10G"].memory_gib == 24


@pytest.mark.parametrize("typed, name", [("H100-SXM", "H100-SXM"), ("h100 sxm", "H100-SXM"),
                                         ("H100", "H100-SXM"), ("rtx4090", "RTX-4090"),
                                         ("RTX_3090", "RTX-3090"), ("b200", "B200"),
                                         ("NVIDIA H100 PCIe", "H100-PCIe"),
                                         ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
                                         ("AMD Instinct MI300X", "MI300X")])
def test_gpu_names_are_read_loosely(typed: str, name: str) -> None:
    assert device_spec(typed) is DEVICES[name]
    assert require_device(typed) is DEVICES[name]


def test_unknown_gpu_is_one_line_listing_the_names() -> None:
    assert device_spec("H800") is None
    with pytest.raises(SpecError) as err:
        require_device("H800")
    message = str(err.value)
    assert "\n" not in message and "'H800'" in message
    assert all(name in message for name in DEVICES)


def test_ambiguous_family_names_the_candidates() -> None:
    with pytest.raises(SpecError, match="ambiguous: A100-80GB, A100-80GB-PCIe, A100-40GB"):
        require_device("A100")


@pytest.mark.parametrize("cuda_name, name", [
    ("NVIDIA B200", "B200"), ("NVIDIA H200", "H200"), ("NVIDIA H100 80GB HBM3", "H100-SXM"),
    ("NVIDIA H100 PCIe", "H100-PCIe"), ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
    ("NVIDIA A100 80GB PCIe", "A100-80GB-PCIe"), ("NVIDIA A100-PCIE-40GB", "A100-40GB-PCIe"),
    ("NVIDIA L40S", "L40S"), ("NVIDIA L4", "L4"), ("NVIDIA A10G", "A10G"),
    ("NVIDIA GeForce RTX 4090", "RTX-4090"), ("NVIDIA GeForce RTX 3090", "RTX-3090"),
    ("Tesla T4", "T4"), ("Tesla V100-SXM2-16GB", "V100-SXM2-16GB"),
    ("Tesla V100-PCIE-32GB", "V100-PCIe-32GB"), ("AMD Instinct MI300X", "MI300X")])
def test_cuda_names_find_their_own_entry(cuda_name: str, name: str) -> None:
    assert spec_for_device_name(cuda_name) is DEVICES[name]
    for dtype, peak in DEVICES[name].peaks.items():
        assert lookup_peak(cuda_name, dtype) is peak


@pytest.mark.parametrize("cuda_name", [
    "NVIDIA L40",                   # not an L4 ("L4" matches whole words only)
    "NVIDIA GH200 480GB", "NVIDIA GB200", "NVIDIA H200 NVL",  # not an H200 or a B200
    "NVIDIA GeForce RTX 4090 D", "NVIDIA GeForce RTX 4090 Laptop GPU",
    "NVIDIA GeForce RTX 3090 Ti", "NVIDIA T400", "Tesla V100S-PCIE-32GB", "NVIDIA A10",
    "NVIDIA B200 MIG 1g.23gb", "NVIDIA H100 80GB HBM3 MIG 3g.40gb"])
def test_lookalikes_and_slices_get_nothing(cuda_name: str) -> None:
    assert spec_for_device_name(cuda_name) is None
    for dtype in DTYPES:
        assert lookup_peak(cuda_name, dtype) is None


def test_other_a100_form_factors_keep_the_family_peak_but_no_spec() -> None:
    # The A100 datasheet gives every form factor the same peaks; memory and bandwidth differ
    assert peak_key("NVIDIA A100-SXM4-64GB") == "A100"
    assert lookup_peak("NVIDIA A100-SXM4-64GB", "bf16").tflops == 312.0
    assert spec_for_device_name("NVIDIA A100-SXM4-64GB") is None
