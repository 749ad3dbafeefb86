"""Attention kernels behind one interface: (q, k, v, is_causal) -> o.

Every implementation takes q (..., Tq, d), k (..., Tk, d), v (..., Tk, d) with the same leading
dims, either (batch,) or (batch, heads), and returns o (..., Tq, d) in q's dtype, differentiable.
Scale 1/sqrt(d); causal masking is top-left aligned (query t sees keys 0..t), as in
`F.scaled_dot_product_attention(is_causal=True)`. IMPLEMENTATIONS is the one attention registry
(the table of them: docs/commands/attention.md); the reference LM adapts these kernels to its
causal (q, k, v) call (`lmperf.model.attention`), and every unknown name is a SpecError.

`get(name)` returns the function wrapped in `check_inputs`, which raises SpecError (one line) for
mismatched shapes, a dtype or device the implementation does not support, or a missing dependency;
`supports(name, device, dtype)` says why a combination cannot run without raising.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from lmperf.errors import SpecError
from lmperf.kernels.naive import NaiveAttention, naive_attention, softmax
from lmperf.validate import choice

AttentionKernel = Callable[..., torch.Tensor]
"""fn(q, k, v, is_causal: bool = False) -> o."""

_FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   is_causal: bool = False) -> torch.Tensor:
    """`F.scaled_dot_product_attention`, whichever backend torch selects."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


def compiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       is_causal: bool = False) -> torch.Tensor:
    """`torch.compile(naive_attention)`, shared by the whole process."""
    from lmperf.kernels.compiled import compile_fn

    return compile_fn(naive_attention)(q, k, v, is_causal)


# aten op (substring) that each fused SDPA backend dispatches to -> torch's SDPBackend name.
_SDPA_OPS = (
    ("_scaled_dot_product_flash_attention", "flash_attention"),  # also ..._for_cpu
    ("_flash_attention_forward", "flash_attention"),
    ("_scaled_dot_product_efficient_attention", "efficient_attention"),
    ("_efficient_attention_forward", "efficient_attention"),
    ("_scaled_dot_product_cudnn_attention", "cudnn_attention"),
    ("_scaled_dot_product_fused_attention_overrideable", "overrideable"),
)


def sdpa_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> str:
    """Which SDPA backend torch runs for these inputs: "flash_attention", "efficient_attention",
    "cudnn_attention", "overrideable", "math", or "unknown".

    Best effort, read from what torch actually dispatches: one SDPA call runs under a
    TorchDispatchMode that records the aten ops. Each fused backend is a single aten op
    (`aten::_scaled_dot_product_flash_attention[_for_cpu]`, ...); the math backend is a
    composite that decomposes into bmm/softmax, so seeing no fused op means "math". The call is
    a real one (it costs one forward); "unknown" if the dispatch mode is unavailable.
    """
    try:
        from torch.utils._python_dispatch import TorchDispatchMode
    except ImportError:  # private module; absent or moved in some torch version
        return "unknown"

    class _Recorder(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with _Recorder() as rec:
        F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    for op in rec.ops:
        for pattern, backend in _SDPA_OPS:
            if pattern in op:
                return backend
    return "math"


def _load_flash_torch() -> AttentionKernel:
    """FlashAttention-2 in PyTorch with its default tiles (64 x 64), imported on first use."""
    from lmperf.kernels.flash_torch import flash_attention_torch

    return flash_attention_torch


def _triton_missing() -> str | None:
    """The one-line reason flash-triton cannot be imported, or None."""
    if importlib.util.find_spec("triton") is None:
        return "flash-triton needs triton; pip install triton"
    return None


def interpreter_gap() -> str | None:
    """Why Triton's CPU interpreter cannot run flash-triton here, or None. Before Triton 3.7 it
    reads a loop bound as int() of a one-element array, which numpy 2.4 refuses
    (triton-lang/triton#9171): every kernel call fails with "only 0-dimensional arrays"."""
    import re
    from importlib.metadata import PackageNotFoundError, version

    try:
        triton_v, numpy_v = version("triton"), version("numpy")
    except PackageNotFoundError:
        return None
    release = lambda v: tuple(int(x) for x in re.findall(r"\d+", v)[:2])  # noqa: E731
    if release(triton_v) < (3, 7) and release(numpy_v) >= (2, 4):
        return (f"Triton {triton_v}'s interpreter cannot run with numpy {numpy_v} "
                "(triton-lang/triton#9171): pip install 'triton>=3.7' or 'numpy<2.4'")
    return None


def triton_interpreter() -> bool:
    """True when Triton runs kernels through its CPU interpreter (TRITON_INTERPRET=1).

    Triton reads the variable when a kernel is decorated, so it must be set before
    `lmperf.kernels.flash_triton` is first imported.
    """
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


def _load_flash_triton() -> AttentionKernel:
    reason = _triton_missing()
    if reason is not None:
        raise SpecError(reason)
    try:
        from lmperf.kernels.flash_triton import flash_attention_triton
    except ModuleNotFoundError as e:
        if e.name != "lmperf.kernels.flash_triton":
            raise
        raise SpecError("flash-triton is not available in this lmperf build") from None
    return flash_attention_triton


@dataclass(frozen=True)
class Implementation:
    """One registry entry: name, dtypes it accepts, and how to load its function lazily (what
    each computes: the table in docs/commands/attention.md)."""

    name: str
    dtypes: tuple[torch.dtype, ...]
    load: Callable[[], AttentionKernel]


IMPLEMENTATIONS: dict[str, Implementation] = {
    impl.name: impl for impl in (
        Implementation("naive", _FLOATS, lambda: naive_attention),
        Implementation("sdpa", _FLOATS, lambda: sdpa_attention),
        Implementation("compiled", _FLOATS, lambda: compiled_attention),
        Implementation("flash-torch", _FLOATS, _load_flash_torch),
        # Triton's tl.dot has no float64 path on GPUs; fp16/bf16/fp32 only.
        Implementation("flash-triton", (torch.float32, torch.bfloat16, torch.float16),
                       _load_flash_triton),
    )
}
NAMES: tuple[str, ...] = tuple(IMPLEMENTATIONS)


def _impl(name: str) -> Implementation:
    return IMPLEMENTATIONS[choice("attention implementation", name, NAMES)]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def supports(name: str, device: torch.device | str, dtype: torch.dtype) -> str | None:
    """None if `name` can run on (device, dtype) here, else the one-line reason it cannot."""
    if name not in IMPLEMENTATIONS:
        return f"unknown attention implementation {name!r}; accepted: {', '.join(NAMES)}"
    impl = IMPLEMENTATIONS[name]
    device = torch.device(device)
    if dtype not in impl.dtypes:
        accepted = ", ".join(_dtype_name(d) for d in impl.dtypes)
        return f"{name} does not support {_dtype_name(dtype)} (supported: {accepted})"
    if name == "compiled":
        from lmperf.kernels.compiled import compile_unavailable_reason

        return compile_unavailable_reason(device.type)
    if name == "flash-triton":
        reason = _triton_missing()
        if reason is not None:
            return reason
        if device.type == "cuda":
            return None
        if device.type == "cpu" and triton_interpreter():
            return interpreter_gap()
        return (f"flash-triton needs a CUDA device, or TRITON_INTERPRET=1 to run Triton's "
                f"interpreter on the CPU (got {device.type})")
    return None


def check_inputs(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise SpecError (one line) unless q, k, v are valid inputs for implementation `name`."""
    for label, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise SpecError(f"{name}: {label} must be a tensor, got {type(t).__name__}")
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if not q.ndim == k.ndim == v.ndim or q.ndim not in (3, 4):
        raise SpecError(f"{name}: q, k, v must all be (batch, seq, d) or (batch, heads, seq, d); "
                        f"got {shapes}")
    if not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        raise SpecError(f"{name}: q, k, v batch/head dims differ: {shapes}")
    if k.shape[-2] != v.shape[-2]:
        raise SpecError(f"{name}: k and v have different sequence lengths: {shapes}")
    if not q.shape[-1] == k.shape[-1] == v.shape[-1]:
        raise SpecError(f"{name}: q, k, v head dims (d) differ: {shapes}")
    if q.shape[-2] == 0 or k.shape[-2] == 0 or q.shape[-1] == 0:
        raise SpecError(f"{name}: empty sequence or head dim: {shapes}")
    if not q.dtype == k.dtype == v.dtype:
        raise SpecError(f"{name}: q, k, v dtypes differ: "
                        f"{_dtype_name(q.dtype)}, {_dtype_name(k.dtype)}, {_dtype_name(v.dtype)}")
    if not q.device == k.device == v.device:
        raise SpecError(f"{name}: q, k, v are on different devices: "
                        f"{q.device}, {k.device}, {v.device}")
    reason = supports(name, q.device, q.dtype)
    if reason is not None:
        raise SpecError(reason)


def get(name: str, validate: bool = True) -> AttentionKernel:
    """The implementation `name` as fn(q, k, v, is_causal=False) -> o.

    With `validate` (default) each call first runs `check_inputs` (microseconds of Python);
    timing loops may pass validate=False after checking once. Raises SpecError for an unknown
    name or a missing dependency (flash-triton without triton).
    """
    fn = _impl(name).load()
    if not validate:
        return fn

    @functools.wraps(fn)
    def checked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                is_causal: bool = False) -> torch.Tensor:
        check_inputs(name, q, k, v)
        return fn(q, k, v, is_causal)

    return checked


__all__ = ["AttentionKernel", "IMPLEMENTATIONS", "Implementation", "NAMES", "NaiveAttention",
           "check_inputs", "compiled_attention", "get", "naive_attention",
           "interpreter_gap", "sdpa_attention", "sdpa_backend", "softmax", "supports",
           "triton_interpreter"]
