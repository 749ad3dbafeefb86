"""`torch.compile` wrappers that fail with one clear line where compilation cannot work.

Compilation is lazy: `torch.compile(fn)` returns at once and the real work (tracing, Inductor's
C++ or Triton code generation) happens on the first call for each new input signature. So the
environment is checked up front (`compile_unavailable_reason`), and a backend failure on a call is
turned into a SpecError naming the cause instead of a page of Inductor traceback.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from typing import Any, Callable

import torch

from lmperf.errors import SpecError


@functools.cache
def compile_unavailable_reason(device_type: str) -> str | None:
    """Why `torch.compile` (Inductor) cannot run on `device_type` here, or None if it can.

    CPU needs a C++ compiler (Inductor writes and builds C++); CUDA needs triton.
    """
    dynamo = importlib.import_module("torch._dynamo")  # not `import torch._dynamo`: shadows torch
    if not dynamo.is_dynamo_supported():
        return "torch.compile is not supported on this Python version or platform"
    if device_type == "cpu":
        try:
            from torch._inductor.cpp_builder import get_cpp_compiler

            get_cpp_compiler()
        except Exception as e:  # noqa: BLE001 - Inductor raises several types for this
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            return f"torch.compile on CPU needs a C++ compiler (g++ or clang++): {first}"
    elif device_type == "cuda" and importlib.util.find_spec("triton") is None:
        return "torch.compile on CUDA needs triton; pip install triton"
    return None


class CompiledFunction:
    """`torch.compile(fn)`, checked before the first call on each device type."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        self._compiled = torch.compile(fn)
        self._checked: set[str] = set()
        functools.update_wrapper(self, fn)

    def _device_type(self, args: tuple[Any, ...]) -> str:
        return next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        device_type = self._device_type(args)
        if device_type not in self._checked:
            reason = compile_unavailable_reason(device_type)
            if reason is not None:
                raise SpecError(reason)
            self._checked.add(device_type)
        try:
            return self._compiled(*args, **kwargs)
        except torch._dynamo.exc.BackendCompilerFailed as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise SpecError(f"torch.compile of {self.fn.__name__} failed: {first}") from e


@functools.cache
def compile_fn(fn: Callable[..., Any]) -> CompiledFunction:
    """The process-wide compiled version of `fn`, so that every caller shares one set of
    compiled graphs (compiling is seconds on CPU)."""
    return CompiledFunction(fn)
