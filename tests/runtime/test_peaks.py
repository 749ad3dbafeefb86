"""Peak FLOP/s table: lookups by device name and dtype, no borrowed peaks."""

from __future__ import annotations

import pytest

from lmperf.runtime.peaks import PEAKS, Peak, lookup_peak


def test_h100_sxm_bf16():
    peak = lookup_peak("NVIDIA H100 80GB HBM3", "bf16")
    assert isinstance(peak, Peak)
    assert peak.tflops == 989.4
    assert peak.source and "H100" in peak.source and "SXM" in peak.source


@pytest.mark.parametrize("dtype,tflops", [("bf16", 989.4), ("fp16", 989.4), ("tf32", 494.7),
                                          ("fp32", 66.9)])
def test_h100_sxm_all_dtypes(dtype, tflops):
    assert lookup_peak("NVIDIA H100 80GB HBM3", dtype).tflops == tflops


def test_h100_pcie_gets_the_pcie_figure():
    peak = lookup_peak("NVIDIA H100 PCIe", "bf16")
    assert peak is not None
    assert peak.tflops == 756.0
    assert "PCIe" in peak.source
    assert lookup_peak("NVIDIA H100 PCIe", "tf32").tflops == 378.0
    assert lookup_peak("NVIDIA H100 PCIe", "fp32").tflops == 51.0


@pytest.mark.parametrize("name", ["NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA GH200 480GB"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "tf32", "fp32"])
def test_variants_with_other_peaks_get_none(name, dtype):
    assert lookup_peak(name, dtype) is None


@pytest.mark.parametrize("name", ["AMD EPYC 7B13", "NVIDIA GeForce RTX 2080 Ti", "NVIDIA H800",
                                  "Intel(R) Xeon(R) Platinum 8480+", ""])
def test_unknown_device_gets_none(name):
    for dtype in ("bf16", "fp16", "tf32", "fp32"):
        assert lookup_peak(name, dtype) is None


def test_a100_fp32():
    peak = lookup_peak("NVIDIA A100-SXM4-80GB", "fp32")
    assert peak is not None and peak.tflops == 19.5 and "A100" in peak.source
    assert lookup_peak("NVIDIA A100-SXM4-80GB", "bf16").tflops == 312.0
    assert lookup_peak("NVIDIA A100-SXM4-80GB", "tf32").tflops == 156.0


def test_h200():
    assert lookup_peak("NVIDIA H200", "bf16").tflops == 989.4
    assert "H200" in lookup_peak("NVIDIA H200", "bf16").source


def test_unknown_dtype_gets_none():
    assert lookup_peak("NVIDIA H100 80GB HBM3", "int8") is None
    # FP8 tensor cores: sm_89 and newer (an A100 has none), the datasheet's dense figure
    assert lookup_peak("NVIDIA A100-SXM4-80GB", "fp8") is None
    assert lookup_peak("NVIDIA H100 80GB HBM3", "fp8").tflops == 1978.9


def test_every_peak_has_a_source_and_a_positive_figure():
    for key, table in PEAKS:
        for dtype, peak in table.items():
            assert dtype in ("bf16", "fp16", "tf32", "fp32", "fp8"), key
            assert peak.tflops > 0 and peak.source, key


def test_specific_variants_are_tried_before_their_family():
    keys = [k for k, _ in PEAKS]
    assert keys.index("H100 NVL") < keys.index("H100")
    assert keys.index("H100 PCIe") < keys.index("H100")
    assert keys.index("GH200") < keys.index("H200")
    assert keys.index("H200 NVL") < keys.index("H200")
