"""Peak dense FLOP/s per (device, dtype), each with its source; used for MFU.

A device that is not in the table gets no peak (MFU is then null): an unknown device never
borrows another device's peak. Nor does a MIG slice: CUDA names a MIG device after its GPU plus
the slice ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", see NVIDIA's MIG user guide, "MIG Device
Names"), and a slice has a fraction of the GPU's SMs, so it matches only an entry whose key names
MIG itself. Figures are dense (no 2:4 sparsity), in TFLOP/s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Peak:
    """A device's peak for one math dtype."""

    tflops: float
    source: str


_A100 = "NVIDIA A100 Tensor Core GPU datasheet (SXM4), dense"
_H100_SXM = "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM), dense"
_H100_PCIE = "NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe), dense"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM), dense"

# (substring of torch.cuda.get_device_name(), in the order tried) -> {math dtype: Peak}
# "tf32" is fp32 storage with TF32 tensor-core matmuls; "fp32" is plain fp32 FMA throughput.
# Variants whose peaks differ from their family's (NVL, Grace Hopper) map to an empty table, so
# they get no MFU rather than a borrowed one.
PEAKS: list[tuple[str, dict[str, Peak]]] = [
    ("H100 NVL", {}),
    ("H200 NVL", {}),
    ("GH200", {}),
    ("H100 PCIe", {"bf16": Peak(756.0, _H100_PCIE), "fp16": Peak(756.0, _H100_PCIE),
                   "tf32": Peak(378.0, _H100_PCIE), "fp32": Peak(51.0, _H100_PCIE)}),
    ("H100", {"bf16": Peak(989.4, _H100_SXM), "fp16": Peak(989.4, _H100_SXM),
              "tf32": Peak(494.7, _H100_SXM), "fp32": Peak(66.9, _H100_SXM)}),
    ("H200", {"bf16": Peak(989.4, _H200), "fp16": Peak(989.4, _H200),
              "tf32": Peak(494.7, _H200), "fp32": Peak(66.9, _H200)}),
    ("A100", {"bf16": Peak(312.0, _A100), "fp16": Peak(312.0, _A100),
              "tf32": Peak(156.0, _A100), "fp32": Peak(19.5, _A100)}),
]


_MIG = re.compile(r"\bMIG\b")


def is_mig(device_name: str) -> bool:
    """Whether a CUDA device name is a MIG slice's ("... MIG 1g.5gb", "... MIG 4c.7g.40gb")."""
    return _MIG.search(device_name) is not None


def peak_key(device_name: str) -> str | None:
    """The key of the PEAKS entry that `device_name` uses, or None when it has none. A MIG
    slice uses only an entry whose key says MIG (there are none yet: a slice gets no peak)."""
    mig = is_mig(device_name)
    for key, _ in PEAKS:
        if key in device_name and is_mig(key) == mig:
            return key
    return None


def lookup_peak(device_name: str, math_dtype: str) -> Peak | None:
    """The peak for `device_name` doing matmuls in `math_dtype` ('fp32', 'tf32', 'bf16', 'fp16');
    None for an unknown device, a variant whose peak differs from its family's, a MIG slice, or
    a dtype the entry lacks."""
    key = peak_key(device_name)
    return None if key is None else dict(PEAKS)[key].get(math_dtype)
