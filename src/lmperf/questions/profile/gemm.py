"""What a GEMM kernel's name says: architecture, precision (fp32 on CUDA cores or tensor cores,
in which dtype), tile and layout - the part of a cuBLAS / CUTLASS name a reader of a profile
needs to tell whether a matmul used the tensor cores.

Families read (NVIDIA documents no cuBLAS kernel naming; the readings follow CUTLASS's
`procedural_name`, which cuBLAS's embedded CUTLASS kernels use, and are checked on real names):
- CUTLASS 2.x `cutlass_<arch>_<simt|tensorop>_<C type>_<acc><mma>gemm_<A type>_<M>x<N>_..._<nt>`
  and 3.x `cutlass3x_sm<arch>_<op>_<core>gemm_<A>_<B>_<acc>_<C>_<D>_<MxNxK>_..._<ntn>`;
- cuBLAS `<arch family>_<core>gemm_..._<M>x<N>_..._<nt>` (`ampere_sgemm_128x64_tn`,
  `ampere_fp16_s16816gemm_fp16_128x128_..._nn`) and `sm<arch>_xmma_gemm_<A><B>_<compute><acc>
  _..._<nt>_<n>_tilesize<MxNxK>_..._tensor<mma>|ffma` (compute tf32: fp32 run in TF32);
- `nvjet_sm<arch>_*` (Hopper/Blackwell cuBLAS, naming undocumented: the architecture only),
  `gemv*` and `splitKreduce_kernel` (a GEMV, the reduction of a split-K GEMM).
In a core `<acc><mma>gemm` the letter is the accumulator (s fp32, h fp16, d fp64) and digits an
MMA shape (16816 = 16x8x16: tensor cores); `sgemm` without a shape runs on CUDA cores (SIMT).
Layout letters: n = column-major, t = row-major, for the kernel's A and B in cuBLAS's
convention: PyTorch calls cuBLAS with its operands swapped, so `F.linear` runs as a `tn` kernel.
"""

from __future__ import annotations

import re

FIELDS: tuple[str, ...] = ("family", "kind", "arch", "arch_family", "inputs", "accumulate",
                           "math", "tile", "layout")
ARCH_FAMILY = {"70": "Volta", "72": "Volta", "75": "Turing", "80": "Ampere", "86": "Ampere",
               "87": "Ampere", "89": "Ada", "90": "Hopper", "100": "Blackwell",
               "101": "Blackwell", "103": "Blackwell", "120": "Blackwell", "121": "Blackwell"}
DTYPES = {"s": "fp32", "h": "fp16", "d": "fp64", "f32": "fp32", "fp32": "fp32", "f16": "fp16",
          "fp16": "fp16", "bf16": "bf16", "tf32": "tf32", "f64": "fp64", "e4m3": "fp8 e4m3",
          "e5m2": "fp8 e5m2", "s8": "int8", "i8": "int8", "int8": "int8"}
_TYPE = re.compile(r"bf16|tf32|e4m3|e5m2|fp16|fp32|f16|f32|f64|s8|i8|int8")
_CORE = re.compile(r"^(?P<acc>bf16|tf32|[shd])?(?P<mma>\d+(?:x\d+x\d+)?)?gemm$")
_FAMILIES = (
    ("cutlass", re.compile(r"cutlass3x_sm(?P<arch>\d+)a?_(?P<op>[a-z]+)_(?P<body>\w+)")),
    ("cutlass", re.compile(r"cutlass_(?:(?P<arch>\d+)_)?(?P<op>[a-z_]*?(?:simt|tensorop))_"
                           r"(?P<body>\w*?gemm\w*)")),
    ("cublas", re.compile(r"sm(?P<arch>\d+)a?_xmma_gemm_(?P<body>\w+)")),
    ("cublas nvjet", re.compile(r"nvjet_(?:sm(?P<arch>\d+)a?_)?(?P<body>\w+)")),
    ("cublas", re.compile(r"(?:^|[^A-Za-z0-9])(?:trt_)?(?P<fam>volta|turing|ampere|ada|hopper|"
                          r"blackwell|maxwell|pascal)_(?P<body>\w*?gemm\w*)")),
)


def _blank(family: str, kind: str = "gemm", arch: str | None = None) -> dict:
    out = dict.fromkeys(FIELDS)
    out.update(family=family, kind=kind)
    if arch:
        out["arch"], out["arch_family"] = f"sm{arch}", ARCH_FAMILY.get(arch)
    return out


def _read(out: dict, tokens: list[str], xmma: bool) -> None:
    """Fill precision, tile and layout from a name's `_`-separated tokens."""
    for i, token in enumerate(tokens):
        core = _CORE.match(token)
        if core:
            acc, mma = core.group("acc"), core.group("mma")
            out["accumulate"] = DTYPES.get(acc) if acc else out["accumulate"]
            out["math"] = "tensor core" if mma else out["math"] or ("simt" if acc else None)
            after = next((t for t in tokens[i + 1:] if _TYPE.fullmatch(t)), None)
            out["inputs"] = out["inputs"] or DTYPES.get(after or "") or out["accumulate"]
        elif xmma and re.fullmatch(r"(?:%s)+" % _TYPE.pattern, token):
            types = _TYPE.findall(token)
            if out["inputs"] is None:
                out["inputs"] = DTYPES[types[0]]
            elif out["accumulate"] is None and len(types) == 2:  # compute, accumulate
                out["accumulate"] = DTYPES[types[1]]
                out["math"] = "tensor core" if types[0] == "tf32" else out["math"]
                out["inputs"] += " (TF32 compute)" if types[0] == "tf32" else ""
        elif m := re.fullmatch(r"(?:tilesize)?(\d+x\d+(?:x\d+)?)", token):
            out["tile"] = out["tile"] or m.group(1)
        elif re.fullmatch(r"[nt]{2,3}", token) and out["layout"] is None:
            out["layout"] = token[:2]
        elif re.fullmatch(r"tensor\d+x\d+x\d+", token):
            out["math"] = "tensor core"
        elif token == "ffma":
            out["math"] = "simt"


def decode_gemm(name: str) -> dict | None:
    """What a GEMM kernel name states (the keys of `FIELDS`, None where it is silent), or None
    for a name that is not a GEMM kernel name of a family this module reads."""
    for family, pattern in _FAMILIES:
        m = pattern.search(name)
        if not m:
            continue
        groups = m.groupdict()
        out = _blank(family, arch=groups.get("arch"))
        if groups.get("fam"):
            out["arch_family"] = groups["fam"].capitalize()
        if family == "cublas nvjet":
            return out
        op = groups.get("op") or ""
        if op:
            out["math"] = "simt" if op.endswith("simt") else "tensor core"
        tokens = m.group("body").split("_")
        if "cutlass3x" in m.group(0):  # <core>gemm_<A>_<B>_<acc>_<C>_<D>_<MxNxK>_...
            a, acc = tokens[1], tokens[3] if len(tokens) > 3 else None
            out["inputs"], out["accumulate"] = DTYPES.get(a, a), DTYPES.get(acc or "", acc)
            tokens = tokens[6:]
        _read(out, tokens, xmma=family == "cublas" and "xmma" in m.group(0))
        return out
    if re.search(r"splitKreduce_kernel", name):
        return _blank("cublas", kind="split-K reduction")
    if re.search(r"(?<![A-Za-z0-9])gemv", name):
        return _blank("cublas", kind="gemv")
    return None


def describe_gemm(name: str) -> str:
    """A short text of what `decode_gemm` read, e.g. "Ampere, fp32 SIMT, tile 128x64, layout
    tn"; "" when the name is not a decodable GEMM name."""
    g = decode_gemm(name)
    if g is None:
        return ""
    parts = ["cuBLAS nvjet GEMM"] if g["family"] == "cublas nvjet" else (
        [f"cuBLAS {g['kind']}"] if g["kind"] != "gemm" else [])
    arch = " ".join(filter(None, (g["arch_family"], g["arch"] and f"({g['arch']})")))
    parts += [arch] if arch else []
    if g["inputs"]:
        simt = g["math"] == "simt" and g["accumulate"] in (None, g["inputs"])
        parts += [f"{g['inputs']} SIMT"] if simt else [p for p in (
            f"{g['inputs']} inputs",
            g["accumulate"] and g["accumulate"] != g["inputs"] and f"{g['accumulate']} accumulate",
            g["math"] == "tensor core" and "tensor cores") if p]
    parts += [f"tile {g['tile']}"] if g["tile"] else []
    parts += [f"layout {g['layout']}"] if g["layout"] else []
    return ", ".join(parts)
