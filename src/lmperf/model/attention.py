"""The reference LM's attention: the `lmperf.kernels` registry adapted to the model's call.

The model calls its attention as causal (q, k, v) -> o on (B, H, T, D); the registry's kernels
take (q, k, v, is_causal). "naive" is the kernels' `NaiveAttention` itself (causal by default),
so that the profiling layer can find it in a model and swap it for its annotated subclass; every
other name is a registry kernel behind `KernelAttention`. This module depends on `lmperf.kernels`,
never the reverse; `ATTENTION`, `NaiveAttention` and `softmax` stay importable from here.
"""

from __future__ import annotations

from typing import Callable

import torch

from lmperf import kernels
from lmperf.kernels.naive import NaiveAttention, softmax

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _compute_dtype(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.dtype:
    """The dtype the naive einsums would compute in: autocast's when it is on, else promotion."""
    device_type = q.device.type
    try:
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
    except (TypeError, RuntimeError):  # a device type autocast does not know (meta, ...)
        pass
    return torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)


class KernelAttention:
    """An `lmperf.kernels` implementation as the model's causal (q, k, v) -> o.

    Under autocast the model hands over fp32 q, k (RoPE keeps fp32) and a low-precision v; the
    kernels want one dtype, so all three are cast to what the naive attention's einsums would run
    in (a no-op without autocast). The flash kernels run their own precision inside (autocast off).
    """

    def __init__(self, name: str):
        self.name = name
        self._fn = kernels.get(name)  # SpecError now (not mid-run) for a missing dependency

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        dtype = _compute_dtype(q, k, v)
        return self._fn(q.to(dtype), k.to(dtype), v.to(dtype), True)  # (B, H, T, D)

    def __repr__(self) -> str:
        return f"KernelAttention({self.name!r})"


def _factory(name: str) -> Callable[[], AttentionFn]:
    if name == NaiveAttention.name:
        return NaiveAttention
    return lambda: KernelAttention(name)


# name -> factory of the model's attention, one entry per registry kernel (same names, same order)
ATTENTION: dict[str, Callable[[], AttentionFn]] = {name: _factory(name) for name in kernels.NAMES}


def make_attention(name: str) -> AttentionFn:
    """A fresh attention for the model by registry name; raises SpecError for an unknown name
    or when the implementation cannot load here (flash-triton without triton)."""
    if name not in ATTENTION:
        kernels.get(name)  # raises the registry's SpecError for an unknown name
    return ATTENTION[name]()


__all__ = ["ATTENTION", "AttentionFn", "KernelAttention", "NaiveAttention", "make_attention",
           "softmax"]
