"""Decoding of GEMM kernel names: architecture, precision, tile, layout, only as far as the name
states them.

`decode_gemm(name)` returns a dict with the keys of `FIELDS` (None where the name says nothing) or
None when the name is not a GEMM kernel name this module can read; `describe_gemm(name)` turns it
into a short text such as "Ampere (sm80), fp32 SIMT, tile 128x32, K-tile 8, 5 stages, layout nt
(B transposed, A not), align1".

Families read, and where each reading comes from:

- CUTLASS 2.x procedural names, `cutlass[_<arch>]_<opclass>_<ext>_<M>x<N>[_<K>x<stages>]_<AB layout>
  _align<n>` (CUTLASS `python/cutlass_library/gemm_operation.py`, `procedural_name`; cuBLAS embeds
  such kernels with the arch number, e.g. `cutlass_80_simt_sgemm_128x32_8x5_nt_align1`). In <ext>
  the core `<acc><mma>gemm` names the accumulator (s fp32, h fp16, d fp64, c/z complex, i int32)
  and, for tensor-core kernels, the MMA instruction shape (16816 = 16x8x16); a type before the core
  is the output C type and a type after it is the A/B input type, each written only when it
  differs from the accumulator (`extended_name`).
- CUTLASS 3.x names, `cutlass3x_sm<arch>_<opclass>_<core>gemm_<A>_<B>_<acc>_<C>_<D>_<MxNxK tile>
  _<cluster>_<stages>_<ABC layout>_align<n>...` (same file, `_procedural_name` for arch >= 90).
- cuBLAS architecture-prefixed kernels, `ampere_sgemm_128x64_tn`,
  `ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn`, `volta_sgemm_128x64_nn`: read
  with the same core/type convention as CUTLASS (an assumption: NVIDIA documents no cuBLAS kernel
  naming); `<M>x<N>` is the tile, `stages_<K>x<S>` the K-tile and stage count (CUTLASS naming, as
  NVIDIA's forum answers for `stages_64x3`), `sliced<a>x<b>` a sliced-K split. A core without an
  MMA shape (`sgemm`) is read as a SIMT (FFMA) kernel, as CUTLASS names it `*_simt_sgemm_*`.
- cuBLAS `sm<arch>_xmma_gemm_<A><B>[_<compute><acc>_<x>]_<AB layout>_<C layout>_tilesize<MxNxK>
  [_stage<S>][_warpsize..|_warpgroupsize..][_tensor<mma>|_ffma]...`: the first type group is the
  A/B input type; the second is read as compute and accumulator type (f32f32_tf32f32_f32 is an
  fp32 GEMM run in TF32); the third group is kept raw in `types`.
- cuBLAS `nvjet_*` (Hopper/Blackwell cuBLAS): the naming is not documented; only `sm<arch>` and
  `splitK` are read. `gemv*` kernels and `splitKreduce_kernel` are recognised as cuBLAS GEMV and
  the reduction step of a split-K GEMM, nothing more.

Layout letters: n = column-major (BLAS "not transposed"), t = row-major (BLAS "transposed"), for
the kernel's own A and B in cuBLAS's column-major convention. PyTorch calls cuBLAS with its
row-major operands swapped, so the kernel's A is PyTorch's second operand: `F.linear`'s
Y = X @ W^T runs as a `tn` kernel.
"""

from __future__ import annotations

import re

FIELDS: tuple[str, ...] = (
    "family", "kind", "arch", "arch_family", "inputs", "compute", "accumulate", "output", "math",
    "mma", "tile", "tile_k", "stages", "layout", "layout_c", "alignment", "sliced_k", "split_k",
    "epilogue", "types", "unread",
)

ARCH_FAMILY = {
    "70": "Volta", "72": "Volta", "75": "Turing", "80": "Ampere", "86": "Ampere", "87": "Ampere",
    "89": "Ada", "90": "Hopper", "100": "Blackwell", "101": "Blackwell", "103": "Blackwell",
    "120": "Blackwell", "121": "Blackwell",
}
PREFIX_FAMILY = {
    "maxwell": "Maxwell", "pascal": "Pascal", "volta": "Volta", "turing": "Turing",
    "ampere": "Ampere", "ada": "Ada", "hopper": "Hopper", "blackwell": "Blackwell",
}
# Type names as CUTLASS (DataTypeNames, ShortDataTypeNames) and cuBLAS kernel names write them.
DTYPES = {
    "s": "fp32", "h": "fp16", "d": "fp64", "c": "complex fp32", "z": "complex fp64", "i": "int32",
    "f32": "fp32", "fp32": "fp32", "f16": "fp16", "fp16": "fp16", "bf16": "bf16", "tf32": "tf32",
    "f64": "fp64", "fp64": "fp64", "e4m3": "fp8 e4m3", "e5m2": "fp8 e5m2", "f8": "fp8",
    "s8": "int8", "i8": "int8", "int8": "int8", "u8": "uint8", "s32": "int32", "void": "none",
}
# MMA instruction shapes as they appear glued into the core name (m16n8k16 -> "16816").
MMA_SHAPES = {
    "884": "8x8x4", "1684": "16x8x4", "1688": "16x8x8", "16816": "16x8x16", "16832": "16x8x32",
    "16864": "16x8x64", "8816": "8x8x16", "8832": "8x8x32", "161616": "16x16x16",
    "32816": "32x8x16", "83216": "8x32x16",
}
EPILOGUES = {"relu", "gelu", "bias", "silu"}

_TYPE_TOKEN = re.compile(r"^(?:bf16|fp16|fp32|fp64|f16|f32|f64|tf32|e4m3|e5m2|f8|s8|u8|i8|int8|s32)$")
_TYPE_GROUP = re.compile(r"bf16|tf32|e4m3|e5m2|f16|f32|f64|s8|u8|s32|i8|f8")
_CORE = re.compile(r"^(?P<acc>bf16|tf32|[shdczi])?(?P<mma>\d+(?:x\d+x\d+)?)?gemm$")

_CUTLASS2 = re.compile(
    r"cutlass_(?:(?P<arch>\d+)_)?(?P<op>wmma_tensorop|spmma_tensorop|tensorop|simt)_"
    r"(?P<ext>[a-z0-9_]+?)_(?P<m>\d+)x(?P<n>\d+)(?:_(?P<k>\d+)x(?P<stages>\d+))?"
    r"_(?P<layout>[nt]{2})_align(?P<align>\d+)")
_CUTLASS3 = re.compile(
    r"cutlass3x_sm(?P<arch>\d+a?)_(?P<op>[a-z]+)_(?P<core>[a-z0-9]*gemm)_"
    r"(?P<types>(?:[a-z0-9]+_){4}[a-z0-9]+?)_(?P<tile>\d+x\d+x\d+)_(?P<cluster>\d+x\d+x\d+)_"
    r"(?P<stages>\d+)_(?P<layout>[nt]{3})_align(?P<align>\d+)(?P<rest>\w*)")
_CUBLAS = re.compile(
    r"(?:^|[^A-Za-z0-9])(?P<trt>trt_)?(?P<fam>maxwell|pascal|volta|turing|ampere|ada|hopper|"
    r"blackwell)_(?P<body>[A-Za-z0-9_]*?gemm[A-Za-z0-9_]*)")
_XMMA = re.compile(r"sm(?P<arch>\d+a?)_xmma_gemm_(?P<body>[A-Za-z0-9_]+)")
_NVJET = re.compile(r"nvjet_(?:sm(?P<arch>\d+a?)_)?(?P<body>[A-Za-z0-9_]+)")
_GEMV = re.compile(r"(?<![A-Za-z0-9])(gemv[A-Za-z0-9]*)")
_SPLITK_REDUCE = re.compile(r"splitKreduce_kernel")


def _blank(family: str, kind: str = "gemm", sm: str | None = None) -> dict:
    """A decoding with every field None but the family, the kind and, where the name gives its
    number `sm` ("80", "90a"), the architecture."""
    out = dict.fromkeys(FIELDS)
    out.update(family=family, kind=kind, unread=[])
    if sm:
        out["arch"] = f"sm{sm}"
        out["arch_family"] = ARCH_FAMILY.get(sm.rstrip("a"))
    return out


def _read_core(out: dict, ext_tokens: list[str]) -> list[str]:
    """Fill accumulate/mma/output/inputs/epilogue from `[<C type>_]<core>gemm[_<epi>][_<A type>]`;
    return the tokens after the core that were not read."""
    core_at = next((i for i, t in enumerate(ext_tokens) if _CORE.match(t)), None)
    if core_at is None:
        return ext_tokens
    core = _CORE.match(ext_tokens[core_at])
    acc = core.group("acc")
    if acc:
        out["accumulate"] = DTYPES.get(acc, acc)
    mma = core.group("mma")
    if mma:
        out["mma"] = MMA_SHAPES.get(mma, mma)
    before = [t for t in ext_tokens[:core_at] if _TYPE_TOKEN.match(t)]
    if before:
        out["output"] = DTYPES[before[-1]]
    rest = []
    for token in ext_tokens[core_at + 1:]:
        if _TYPE_TOKEN.match(token) and out["inputs"] is None:
            out["inputs"] = DTYPES[token]
        elif token in EPILOGUES:
            out["epilogue"] = token
        else:
            rest.append(token)
    if out["inputs"] is None and out["accumulate"] is not None:
        out["inputs"] = out["accumulate"]  # written only when it differs from the accumulator
    return rest


def _read_other(out: dict, token: str) -> None:
    """A token no family-specific rule read: the split-K flag (any case), else kept in
    `unread` (empty tokens, from doubled underscores, are dropped)."""
    if token.lower() == "splitk":
        out["split_k"] = True
    elif token:
        out["unread"].append(token)


def _layout(out: dict, token: str) -> None:
    out["layout"] = token[:2]
    if len(token) == 3:
        out["layout_c"] = token[2]


def _decode_cutlass2(m: re.Match) -> dict:
    out = _blank("cutlass", sm=m.group("arch"))
    op = m.group("op")
    out["math"] = "simt" if op == "simt" else "tensor core"
    rest = _read_core(out, m.group("ext").split("_"))
    out["unread"] += rest
    out["tile"] = f"{m.group('m')}x{m.group('n')}"
    if m.group("k"):
        out["tile_k"], out["stages"] = int(m.group("k")), int(m.group("stages"))
    _layout(out, m.group("layout"))
    out["alignment"] = int(m.group("align"))
    return out


def _decode_cutlass3(m: re.Match) -> dict:
    out = _blank("cutlass", sm=m.group("arch"))
    out["math"] = "simt" if m.group("op") == "simt" else "tensor core"
    core = _CORE.match(m.group("core"))
    if core and core.group("mma"):
        out["mma"] = MMA_SHAPES.get(core.group("mma"), core.group("mma"))
    a, b, acc, c, d = m.group("types").split("_")
    out["types"] = m.group("types")
    out["inputs"] = DTYPES.get(a, a) if a == b else f"{DTYPES.get(a, a)}/{DTYPES.get(b, b)}"
    out["accumulate"] = DTYPES.get(acc, acc)
    out["output"] = DTYPES.get(d, d)
    out["tile"] = m.group("tile")
    out["tile_k"] = int(m.group("tile").split("x")[2])
    out["stages"] = int(m.group("stages"))
    _layout(out, m.group("layout"))
    out["alignment"] = int(m.group("align"))
    out["unread"] += [t for t in m.group("rest").split("_") if t] + [f"cluster{m.group('cluster')}"]
    return out


def _decode_cublas(m: re.Match) -> dict:
    out = _blank("tensorrt" if m.group("trt") else "cublas")
    out["arch_family"] = PREFIX_FAMILY[m.group("fam")]
    tokens = m.group("body").split("_")
    rest = _read_core(out, tokens)
    if out["mma"]:
        out["math"] = "tensor core"
    elif out["accumulate"] is not None:
        out["math"] = "simt"
    it = iter(rest)
    for token in it:
        if re.fullmatch(r"\d+x\d+", token) and out["tile"] is None:
            out["tile"] = token
        elif re.fullmatch(r"sliced\d+x\d+", token):
            out["sliced_k"] = token[len("sliced"):]
        elif token == "stages":
            kxs = next(it, "")
            if re.fullmatch(r"\d+x\d+", kxs):
                k, s = kxs.split("x")
                out["tile_k"], out["stages"] = int(k), int(s)
            else:
                out["unread"] += [token, kxs]
        elif re.fullmatch(r"[nt]{2}", token):
            out["layout"] = token
        else:
            _read_other(out, token)
    return out


def _decode_xmma(m: re.Match) -> dict:
    out = _blank("cublas", sm=m.group("arch"))
    tokens = m.group("body").split("_")
    groups = []
    while tokens and re.fullmatch(r"(?:bf16|tf32|e4m3|e5m2|f16|f32|f64|s8|u8|s32|i8|f8)+", tokens[0]):
        groups.append(_TYPE_GROUP.findall(tokens.pop(0)))
    if groups:
        out["types"] = "_".join("".join(g) for g in groups)
        ab = groups[0]
        out["inputs"] = DTYPES[ab[0]] if len(set(ab)) == 1 else "/".join(DTYPES[t] for t in ab)
    if len(groups) > 1 and len(groups[1]) == 2:
        out["compute"], out["accumulate"] = (DTYPES[t] for t in groups[1])
        if groups[1][0] == "tf32":
            out["math"] = "tensor core"  # TF32 is a tensor-core math mode
    for token in tokens:
        if re.fullmatch(r"[nt]{2}", token) and out["layout"] is None:
            out["layout"] = token
        elif re.fullmatch(r"[nt]", token) and out["layout"] and out["layout_c"] is None:
            out["layout_c"] = token
        elif token.startswith("tilesize"):
            out["tile"] = token[len("tilesize"):]
            dims = out["tile"].split("x")
            out["tile_k"] = int(dims[2]) if len(dims) == 3 else None
        elif re.fullmatch(r"stage\d+", token):
            out["stages"] = int(token[len("stage"):])
        elif re.fullmatch(r"tensor\d+x\d+x\d+", token):
            out["mma"], out["math"] = token[len("tensor"):], "tensor core"
        elif token == "ffma":
            out["math"] = "simt"
        elif re.fullmatch(r"aligna\d+", token):
            out["alignment"] = int(token[len("aligna"):])
        else:
            _read_other(out, token)
    return out


def _decode_nvjet(m: re.Match) -> dict:
    out = _blank("cublas nvjet", sm=m.group("arch"))
    for token in m.group("body").split("_"):
        _read_other(out, token)
    return out


def decode_gemm(name: str) -> dict | None:
    """What a GEMM kernel name states: a dict with the keys of `FIELDS` (None where the name is
    silent; `unread` lists the name tokens left uninterpreted), or None for a name that is not a
    GEMM kernel name of a family this module reads (elementwise kernels, aten ops, ...)."""
    for pattern, decoder in (
        (_CUTLASS3, _decode_cutlass3), (_CUTLASS2, _decode_cutlass2), (_XMMA, _decode_xmma),
        (_NVJET, _decode_nvjet), (_CUBLAS, _decode_cublas),
    ):
        m = pattern.search(name)
        if m:
            return decoder(m)
    if _SPLITK_REDUCE.search(name):
        out = _blank("cublas", kind="split-K reduction")
        out["split_k"] = True
        return out
    m = _GEMV.search(name)
    if m:
        out = _blank("cublas", kind="gemv")
        out["unread"] = [m.group(1)]
        return out
    return None


def _layout_text(layout: str) -> str:
    a, b = (c == "t" for c in layout)
    if a and b:
        return "A and B transposed"
    if not a and not b:
        return "neither transposed"
    return "A transposed, B not" if a else "B transposed, A not"


def _precision_text(g: dict) -> str | None:
    inputs, math, acc = g["inputs"], g["math"], g["accumulate"]
    if inputs is None:
        return None
    if math == "simt" and (acc is None or acc == inputs):
        return f"{inputs} SIMT"
    text = f"{inputs} inputs"
    if g["compute"] and g["compute"] != inputs:
        text += f", {g['compute']} compute"
    if acc and (acc != inputs or math == "tensor core"):
        text += f", {acc} accumulate"
    if math == "tensor core":
        text += ", tensor core" + (f" (mma {g['mma']})" if g["mma"] else "")
    elif math == "simt":
        text += ", SIMT"
    if g["output"] and g["output"] not in (inputs, "none"):
        text += f", {g['output']} output"
    return text


def describe_gemm(name: str) -> str:
    """A short human text of what `decode_gemm` read, e.g. "Ampere, fp32 SIMT, tile 128x64,
    layout tn (A transposed, B not)"; "" when the name is not a decodable GEMM name."""
    g = decode_gemm(name)
    if g is None:
        return ""
    parts: list[str] = []
    if g["family"] == "cublas nvjet":
        parts.append("cuBLAS nvjet GEMM (naming undocumented)")
    elif g["kind"] != "gemm":
        parts.append(f"cuBLAS {g['kind']}")
    if g["arch_family"] and g["arch"]:
        parts.append(f"{g['arch_family']} ({g['arch']})")
    elif g["arch_family"] or g["arch"]:
        parts.append(g["arch_family"] or g["arch"])
    precision = _precision_text(g)
    if precision:
        parts.append(precision)
    if g["tile"]:
        parts.append(f"tile {g['tile']}")
        if g["tile_k"] and g["tile"].count("x") == 1:
            parts.append(f"K-tile {g['tile_k']}")
    if g["stages"]:
        parts.append(f"{g['stages']} stages")
    if g["layout"]:
        parts.append(f"layout {g['layout']} ({_layout_text(g['layout'])})")
    if g["layout_c"]:
        parts.append(f"output layout {g['layout_c']}")
    if g["alignment"]:
        parts.append(f"align{g['alignment']}")
    if g["sliced_k"]:
        parts.append(f"sliced-K {g['sliced_k']}")
    if g["split_k"] and g["kind"] == "gemm":
        parts.append("split-K")
    if g["epilogue"]:
        parts.append(f"fused {g['epilogue']} epilogue")
    return ", ".join(parts)
