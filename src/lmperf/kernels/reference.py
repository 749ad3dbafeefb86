"""Float64 reference attention and the per-dtype tolerances every correctness test uses.

The reference is written independently of the implementations under test (`torch.softmax` on
`masked_fill`ed scores, all in float64), so a shared mistake cannot hide. Causal masking is
top-left aligned, as in `F.scaled_dot_product_attention(is_causal=True)`: query i sees keys 0..i.

Tolerances are (atol, rtol) for `torch.testing.assert_close(actual, reference)`, where the
reference is computed in float64 from the *same* low-precision inputs (upcast exactly), so the
error measured is the implementation's arithmetic, not the rounding of its inputs. Inputs are
standard normal q, k, v and upstream gradient (scores of unit scale, outputs and gradients O(1)):

- float32: (1e-4, 1e-4). IEEE fp32 matmuls and exp give ~1e-6 on outputs and gradients at these
  sizes (measured worst 1.6e-6); the bound leaves room for reduction order (tiles, BLAS blocking)
  and longer sequences. TF32 matmuls (`allow_tf32`, Triton's default `tl.dot` precision on
  CUDA) have a 10-bit mantissa, like fp16: compare them against the float16 entry
  (`tolerance(torch.float32, tf32=True)`).
- bfloat16: (3e-2, 3e-2), about 8 eps (eps = 2**-8 ~ 3.9e-3). Rounding the output alone costs up
  to eps/2 relative; an implementation that rounds scores and probabilities to bf16 before its
  matmuls (the naive one, SDPA's math path, a Triton kernel feeding P to tl.dot in bf16) adds
  a few eps more over sums of O(seq) terms. Measured worst (max |a - ref| / (1 + |ref|), CPU,
  seq <= 130, d <= 64): naive 1.6e-2, sdpa 7.6e-3, flash-torch (fp32 inside) 4.1e-3.
- float16: (3e-3, 3e-3), the same ~8 eps with eps = 2**-11 ~ 4.9e-4. Measured worst: naive
  1.5e-3, sdpa 1.1e-3, flash-torch 7.0e-4.
- float64: (1e-10, 1e-10), for implementations that compute in float64 (gradcheck-like tests).
"""

from __future__ import annotations

import math

import torch

TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-4, 1e-4),
    torch.bfloat16: (3e-2, 3e-2),
    torch.float16: (3e-3, 3e-3),
    torch.float64: (1e-10, 1e-10),
}


def tolerance(dtype: torch.dtype, tf32: bool = False) -> tuple[float, float]:
    """(atol, rtol) for results computed in `dtype`; with tf32, fp32 uses the fp16 bound."""
    if tf32 and dtype == torch.float32:
        return TOLERANCES[torch.float16]
    return TOLERANCES[dtype]


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        is_causal: bool = False) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v in float64; returns a float64 tensor shaped like q.

    Differentiable: called on float64 leaves it gives float64 gradients through autograd.
    q (..., Tq, d), k (..., Tk, d), v (..., Tk, dv).
    """
    q, k, v = q.double(), k.double(), v.double()
    s = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (..., Tq, Tk)
    if is_causal:
        tq, tk = s.shape[-2], s.shape[-1]
        above = torch.ones(tq, tk, dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(above, float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), v)


def reference_forward_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor,
    is_causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(o, dq, dk, dv), all float64, for upstream gradient `grad_out` (shaped like o).

    The inputs are detached and upcast, so the caller's tensors and their .grad are untouched.
    """
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    o = reference_attention(q64, k64, v64, is_causal)
    dq, dk, dv = torch.autograd.grad(o, (q64, k64, v64), grad_out.detach().double())
    return o.detach(), dq, dk, dv

