"""GPUs people rent: memory, bandwidths and dense peak FLOP/s per dtype, each with its source.

`lookup_peak(cuda_name, dtype)` is MFU's denominator for the device a run used (a device or MIG
slice not in the table gets none); `device_spec(name)` / `require_device(name)` answer `--gpu
NAME` for a device you do not have. The conventions (dense figures, GiB capacities, link
bandwidth per direction, whole-word name matching): docs/commands/plan.md, "The target"."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from lmperf.errors import SpecError

GB = 1e9
DTYPES: tuple[str, ...] = ("bf16", "fp16", "tf32", "fp32", "fp8")


@dataclass(frozen=True)
class Peak:
    """A device's dense peak for one math dtype, in TFLOP/s, and where the figure comes from."""

    tflops: float
    source: str


@dataclass(frozen=True)
class DeviceSpec:
    """One GPU model as its datasheet gives it (see the module docstring for the units)."""

    name: str                    # what `--gpu` accepts (case, '-', '_' and spaces ignored)
    memory_gib: float            # datasheet capacity, GiB (2**30 B)
    memory_bandwidth: float      # DRAM bandwidth, bytes/s
    link_bandwidth: float        # GPU-to-GPU bytes/s per direction, the link all GPUs share
    interconnect: str            # as the datasheet prints it
    peaks: dict[str, Peak] = field(hash=False)  # math dtype -> dense peak; absent: none
    source: str = ""             # datasheet title and URL
    cuda_names: tuple[str, ...] = ()  # whole-word keys of torch.cuda.get_device_name()
    aliases: tuple[str, ...] = ()     # other names `--gpu` accepts

    def peak_tflops(self, math_dtype: str) -> float | None:
        """Dense peak TFLOP/s in `math_dtype` ('fp32', 'tf32', 'bf16', 'fp16'), or None."""
        peak = self.peaks.get(math_dtype)
        return None if peak is None else peak.tflops


def _peaks(source: str, fp32: float, tf32: float | None, bf16: float | None,
           fp16: float | None, fp8: float | None = None) -> dict[str, Peak]:
    """{dtype: Peak} for the figures a datasheet gives (None: the device has no such math;
    fp8: FP8 tensor cores, sm_89 and newer, e4m3 with fp32 accumulation)."""
    figures = {"bf16": bf16, "fp16": fp16, "tf32": tf32, "fp32": fp32, "fp8": fp8}
    return {d: Peak(v, source) for d, v in figures.items() if v is not None}


# Sources (titles as published; URLs where NVIDIA / AMD host them).
_B200 = ("NVIDIA HGX B200 datasheet (8 GPUs: FP8 72 PFLOPS, FP16/BF16 36 PFLOPS and TF32 18 "
         "PFLOPS with sparsity, FP32 600 TFLOPS, 1.4 TB HBM3e, 64 TB/s, NVLink 5 1.8 TB/s per GPU), per "
         "GPU and dense, https://www.nvidia.com/en-us/data-center/hgx/")
_H100_SXM = ("NVIDIA H100 Tensor Core GPU datasheet (H100 SXM), dense, "
             "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet")
_H100_PCIE = ("NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe), dense, "
              "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet")
# torchtitan's published Llama 3 runs (benchmarks/llama3_h100_202412_torchtitan.md; the TorchTitan
# paper, arXiv 2410.06511): "The H100 GPUs used for the experiments are non-standard. They have
# HBM2e and are limited to a lower TDP. The actual peak TFLOPs should be between SXM and NVL, and
# we don't know the exact value." Taken here: the midpoint of the H100 SXM's and the H100 NVL's
# dense figures (NVL: FP8 3,341, BF16 1,671, TF32 835 TFLOPS with sparsity, FP32 60), so a
# compute-bound
# prediction is within +-8.5% of either bound; 96 GB of HBM2e at 2.4 TB/s, 500 W, NVLink 4
_H100_96GB = ("H100 96GB HBM2e (Meta's, torchtitan's benchmarks): peaks the midpoint of the H100 "
              "SXM's and NVL's dense figures (the TorchTitan paper, arXiv 2410.06511: 'between "
              "SXM and NVL'), 2.4 TB/s, NVLink 4; "
              "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet")
_H200 = ("NVIDIA H200 Tensor Core GPU datasheet (H200 SXM), dense, "
         "https://www.nvidia.com/en-us/data-center/h200/")
_A100 = ("NVIDIA A100 Tensor Core GPU datasheet (SXM4 and PCIe, 40GB and 80GB), dense, "
         "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
         "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf")
_L40S = ("NVIDIA L40S datasheet, dense, https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413")
_L4 = ("NVIDIA L4 Tensor Core GPU datasheet (tensor figures with sparsity: dense is half), "
       "https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet")
_A10G = ("AWS EC2 G5 instances (NVIDIA A10G, 24 GB, 600 GB/s): no dense tensor figure is "
         "published for the A10G (an AWS-only variant of the A10), so it has no peaks, "
         "https://aws.amazon.com/ec2/instance-types/g5/")
_ADA = ("NVIDIA Ada GPU Architecture whitepaper, Appendix A (GeForce RTX 4090; tensor figures "
        "with FP32 accumulate, dense), https://images.nvidia.com/aem-dam/Solutions/geforce/ada/"
        "nvidia-ada-gpu-architecture.pdf")
_GA102 = ("NVIDIA Ampere GA102 GPU Architecture whitepaper, Appendix A (GeForce RTX 3090; tensor "
          "figures with FP32 accumulate, dense), https://www.nvidia.com/content/PDF/"
          "nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf")
_T4 = ("NVIDIA T4 Tensor Core GPU datasheet (mixed precision FP16/FP32 65 TFLOPS), "
       "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/"
       "t4-tensor-core-datasheet-951643.pdf")
_V100 = ("NVIDIA Tesla V100 GPU datasheet (tensor performance = FP16 with FP32 accumulate), "
         "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-"
         "us-1165301-r5.pdf")
_MI300X = ("AMD Instinct MI300X accelerator data sheet (dense; TF32, FP16, BF16 matrix), "
           "https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/data-sheets/"
           "amd-instinct-mi300x-data-sheet.pdf")

_A100_PEAKS = _peaks(_A100, 19.5, 156.0, 312.0, 312.0)
_V100_SXM2_PEAKS = _peaks(_V100 + " (SXM2)", 15.7, None, None, 125.0)
_V100_PCIE_PEAKS = _peaks(_V100 + " (PCIe)", 14.0, None, None, 112.0)
_NVLINK4 = "NVLink 4: 900 GB/s bidirectional (NVSwitch); PCIe Gen5 x16: 128 GB/s"
_NVLINK3 = "NVLink 3: 600 GB/s bidirectional (NVSwitch); PCIe Gen4 x16: 64 GB/s"
_PCIE4 = "PCIe Gen4 x16: 64 GB/s bidirectional; no NVLink"

# In the order CUDA names are tried: a device whose key also matches another device's name
# (H100 matches "NVIDIA H100 PCIe") comes after that device.
_TABLE: tuple[DeviceSpec, ...] = (
    DeviceSpec("B200", 180, 8000 * GB, 900 * GB, "NVLink 5: 1.8 TB/s bidirectional (NVSwitch)",
               _peaks(_B200, 75.0, 1125.0, 2250.0, 2250.0, 4500.0), _B200, ("B200",)),
    DeviceSpec("H200", 141, 4800 * GB, 450 * GB, _NVLINK4,
               _peaks(_H200, 66.9, 494.7, 989.4, 989.4, 1978.9), _H200, ("H200",), ("H200-SXM",)),
    DeviceSpec("H100-PCIe", 80, 2000 * GB, 64 * GB,
               "PCIe Gen5 x16: 128 GB/s bidirectional; NVLink bridge (pairs only): 600 GB/s",
               _peaks(_H100_PCIE, 51.0, 378.0, 756.0, 756.0, 1513.0), _H100_PCIE, ("H100 PCIe",)),
    DeviceSpec("H100-SXM", 80, 3350 * GB, 450 * GB, _NVLINK4,
               _peaks(_H100_SXM, 66.9, 494.7, 989.4, 989.4, 1978.9), _H100_SXM, ("H100",), ("H100",)),
    DeviceSpec("H100-96GB", 96, 2400 * GB, 450 * GB, _NVLINK4,
               _peaks(_H100_96GB, 63.45, 456.1, 912.45, 912.45, 1824.7), _H100_96GB, (),
               ("H100-96G", "H100-HBM2e")),
    DeviceSpec("A100-80GB", 80, 2039 * GB, 300 * GB, _NVLINK3, _A100_PEAKS, _A100 + " (80GB SXM)",
               ("A100-SXM4-80GB",), ("A100-SXM4-80GB", "A100-80GB-SXM")),
    DeviceSpec("A100-80GB-PCIe", 80, 1935 * GB, 32 * GB,
               "PCIe Gen4 x16: 64 GB/s bidirectional; NVLink bridge (pairs only): 600 GB/s",
               _A100_PEAKS, _A100 + " (80GB PCIe)", ("A100 80GB PCIe",)),
    DeviceSpec("A100-40GB", 40, 1555 * GB, 300 * GB, _NVLINK3, _A100_PEAKS, _A100 + " (40GB SXM)",
               ("A100-SXM4-40GB",), ("A100-SXM4-40GB", "A100-40GB-SXM")),
    DeviceSpec("A100-40GB-PCIe", 40, 1555 * GB, 32 * GB,
               "PCIe Gen4 x16: 64 GB/s bidirectional; NVLink bridge (pairs only): 600 GB/s",
               _A100_PEAKS, _A100 + " (40GB PCIe)", ("A100-PCIE-40GB",)),
    DeviceSpec("L40S", 48, 864 * GB, 32 * GB, _PCIE4,
               _peaks(_L40S, 91.6, 183.0, 362.05, 362.05, 733.0), _L40S, ("L40S",)),
    DeviceSpec("L4", 24, 300 * GB, 32 * GB, _PCIE4,
               _peaks(_L4, 30.3, 60.0, 121.0, 121.0, 242.5), _L4, ("L4",)),
    DeviceSpec("A10G", 24, 600 * GB, 32 * GB, _PCIE4, {}, _A10G, ("A10G",)),
    DeviceSpec("RTX-4090", 24, 1008 * GB, 32 * GB,
               "PCIe Gen4 x16: 64 GB/s bidirectional; no NVLink, no peer-to-peer",
               _peaks(_ADA, 82.6, 82.6, 165.2, 165.2, 330.3), _ADA, ("RTX 4090",)),
    DeviceSpec("RTX-3090", 24, 936 * GB, 32 * GB,
               "PCIe Gen4 x16: 64 GB/s bidirectional; NVLink bridge (pairs only): 112.5 GB/s",
               _peaks(_GA102, 35.6, 35.6, 71.0, 71.0), _GA102, ("RTX 3090",)),
    DeviceSpec("T4", 16, 320 * GB, 16 * GB, "PCIe Gen3 x16: 32 GB/s bidirectional; no NVLink",
               _peaks(_T4, 8.1, None, None, 65.0), _T4, ("Tesla T4",)),
    DeviceSpec("V100-SXM2-32GB", 32, 900 * GB, 150 * GB,
               "NVLink 2: 300 GB/s bidirectional; PCIe Gen3 x16: 32 GB/s",
               _V100_SXM2_PEAKS, _V100, ("V100-SXM2-32GB",)),
    DeviceSpec("V100-SXM2-16GB", 16, 900 * GB, 150 * GB,
               "NVLink 2: 300 GB/s bidirectional; PCIe Gen3 x16: 32 GB/s",
               _V100_SXM2_PEAKS, _V100, ("V100-SXM2-16GB",)),
    DeviceSpec("V100-PCIe-32GB", 32, 900 * GB, 16 * GB, "PCIe Gen3 x16: 32 GB/s bidirectional",
               _V100_PCIE_PEAKS, _V100, ("V100-PCIE-32GB",)),
    DeviceSpec("V100-PCIe-16GB", 16, 900 * GB, 16 * GB, "PCIe Gen3 x16: 32 GB/s bidirectional",
               _V100_PCIE_PEAKS, _V100, ("V100-PCIE-16GB",)),
    DeviceSpec("MI300X", 192, 5300 * GB, 448 * GB,
               "AMD Infinity Fabric: 7 links x 128 GB/s bidirectional = 896 GB/s; PCIe Gen5 x16",
               _peaks(_MI300X, 163.4, 653.7, 1307.4, 1307.4, 2614.9), _MI300X, ("MI300X",)),
)

DEVICES: dict[str, DeviceSpec] = {d.name: d for d in _TABLE}

# Variants whose figures differ from their family's: listed without figures, tried first, so
# they get no peak rather than a borrowed one.
_OTHER_FIGURES = ("H100 NVL", "H200 NVL", "GH200", "GB200", "L40", "RTX 4090 D",
                  "RTX 4090 Laptop", "RTX 3090 Ti")

# (whole-word key of a CUDA device name, in the order tried) -> {math dtype: Peak}. After the
# devices, "A100" gives every other A100 form factor the one peak its datasheet gives them all.
PEAKS: list[tuple[str, dict[str, Peak]]] = (
    [(key, {}) for key in _OTHER_FIGURES]
    + [(key, d.peaks) for d in _TABLE for key in d.cuda_names]
    + [("A100", _A100_PEAKS)])
_DEVICE_OF_KEY = {key: d for d in _TABLE for key in d.cuda_names}

_MIG = re.compile(r"\bMIG\b")


def is_mig(device_name: str) -> bool:
    """Whether a CUDA device name is a MIG slice's ("... MIG 1g.5gb", "... MIG 4c.7g.40gb")."""
    return _MIG.search(device_name) is not None


def _names(key: str, device_name: str) -> bool:
    """Whether `key` occurs in `device_name` as a whole word (no letter or digit either side)."""
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", device_name) is not None


def peak_key(device_name: str) -> str | None:
    """The key of the PEAKS entry that `device_name` uses, or None when it has none. A MIG
    slice uses only an entry whose key says MIG (there are none yet: a slice gets no peak)."""
    mig = is_mig(device_name)
    for key, _ in PEAKS:
        if _names(key, device_name) and is_mig(key) == mig:
            return key
    return None


def lookup_peak(device_name: str, math_dtype: str) -> Peak | None:
    """The peak for `device_name` doing matmuls in `math_dtype` ('fp32', 'tf32', 'bf16', 'fp16');
    None for an unknown device, a variant whose peak differs from its family's, a MIG slice, or
    a dtype the entry lacks."""
    key = peak_key(device_name)
    return None if key is None else dict(PEAKS)[key].get(math_dtype)


def spec_for_device_name(device_name: str) -> DeviceSpec | None:
    """The DEVICES entry of a CUDA device name ("NVIDIA H100 80GB HBM3" -> H100-SXM); None for
    an unknown device, a variant listed without figures, an A100 form factor the table does not
    list, or a MIG slice."""
    key = peak_key(device_name)
    return None if key is None else _DEVICE_OF_KEY.get(key)


def _fold(name: str) -> str:
    """A name as `--gpu` compares it: case, spaces, '-' and '_' ignored."""
    return re.sub(r"[\s_\-]+", "", name).lower()


_BY_FOLDED = {_fold(alias): d for d in _TABLE for alias in (d.name, *d.aliases)}


def device_spec(name: str) -> DeviceSpec | None:
    """The DEVICES entry for a `--gpu` name ('H100-SXM', 'h100 sxm', 'RTX4090', 'B200'; case,
    spaces, '-' and '_' ignored) or, failing that, for a CUDA device name; None if neither."""
    found = _BY_FOLDED.get(_fold(name))
    return found if found is not None else spec_for_device_name(name)


def require_device(name: str) -> DeviceSpec:
    """device_spec(name), or SpecError naming the GPUs accepted (one line)."""
    found = device_spec(name)
    if found is not None:
        return found
    close = [d.name for d in _TABLE if _fold(name) and _fold(d.name).startswith(_fold(name))]
    if len(close) > 1:
        raise SpecError(f"GPU {name!r} is ambiguous: {', '.join(close)}")
    raise SpecError(f"unknown GPU {name!r}; accepted: {', '.join(DEVICES)}")
