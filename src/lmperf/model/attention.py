"""Attention implementations behind one interface, chosen by name.

Every implementation maps q, k, v of shape (B, H, T, D) to an output of shape (B, H, T, D),
causal. The naive one is split into three methods (scores, softmax, combine) so that the
profiling layer can subclass it and put a named range around each step without forking the model.
"compiled", "flash-torch" and "flash-triton" are the `lmperf.kernels` implementations of the same
name, adapted by `KernelAttention`.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Max-subtracted softmax, written out as the course writes it (no fused kernel).

    Subtracting the row max keeps exp() from overflowing; a fully masked row would be NaN, which
    causal masking never produces (the diagonal is always kept).
    """
    shifted = x - torch.amax(x, dim=dim, keepdim=True)
    e = torch.exp(shifted)
    return e / torch.sum(e, dim=dim, keepdim=True)


class NaiveAttention:
    """Einsum scores, explicit causal mask, max-subtracted softmax, einsum with V."""

    name = "naive"

    def scores(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Scaled, masked scores (B, H, Tq, Tk); masked positions are -inf."""
        s = torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(q.shape[-1])
        return torch.where(mask, s, float("-inf"))

    def softmax(self, scores: torch.Tensor) -> torch.Tensor:
        """Probabilities over the key axis, same shape as the scores."""
        return softmax(scores, dim=-1)

    def combine(self, probs: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The final matmul: probabilities (B, H, Tq, Tk) @ values (B, H, Tk, D)."""
        return torch.einsum("...qk,...kd->...qd", probs, v)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        t = q.shape[-2]
        # (Tq, Tk) lower-triangular: query i sees keys 0..i.
        mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        return self.combine(self.softmax(self.scores(q, k, mask)), v)


class SdpaAttention:
    """`F.scaled_dot_product_attention` with `is_causal=True`; torch picks the kernel."""

    name = "sdpa"

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


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
    in (a no-op without autocast). The kernels run their own precision inside (autocast off).
    """

    def __init__(self, name: str):
        # Imported here: lmperf.kernels imports this module (NaiveAttention) at its top.
        from lmperf import kernels

        self.name = name
        self._fn = kernels.get(name)  # SpecError now (not mid-run) for a missing dependency

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        dtype = _compute_dtype(q, k, v)
        return self._fn(q.to(dtype), k.to(dtype), v.to(dtype), True)  # (B, H, T, D)

    def __repr__(self) -> str:
        return f"KernelAttention({self.name!r})"


ATTENTION: dict[str, Callable[[], AttentionFn]] = {
    NaiveAttention.name: NaiveAttention,
    SdpaAttention.name: SdpaAttention,
    **{name: partial(KernelAttention, name)
       for name in ("compiled", "flash-torch", "flash-triton")},
}


def make_attention(name: str) -> AttentionFn:
    """Return a fresh attention implementation by name; raises ValueError for an unknown name
    and SpecError (a ValueError) when the implementation cannot load here (flash-triton
    without triton)."""
    try:
        return ATTENTION[name]()
    except KeyError:
        raise ValueError(
            f"unknown attention {name!r}; accepted: {', '.join(sorted(ATTENTION))}"
        ) from None
