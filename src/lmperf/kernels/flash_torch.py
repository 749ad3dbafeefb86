"""FlashAttention-2 in plain PyTorch: tiled online-softmax forward, backward recomputed from L.

Shapes: q (..., Tq, d), k (..., Tk, d), v (..., Tk, dv); the leading dims (batch, or batch and
heads) are flattened to N. Scale s = 1/sqrt(d). Tiles: Bq queries x Bk keys (>= 16 each; they need
not divide Tq or Tk, the last tile of each axis is simply shorter).

Forward, for each query tile Q_i (N, Bq, d), over key tiles j = 0, 1, ... (fp32 accumulators,
float64 for float64 inputs):

    S_ij = s Q_i K_j^T                                   (N, Bq, Bk)
    m_i' = max(m_i, rowmax(S_ij))                        running row max, starts at -inf
    P_ij = exp(S_ij - m_i')                              unnormalised probabilities
    l_i  = exp(m_i - m_i') l_i + rowsum(P_ij)            running row sum, starts at 0
    O_i  = exp(m_i - m_i') O_i + P_ij V_j                (N, Bq, dv), starts at 0
    then  O_i <- O_i / l_i   and   L_i = m_i + log(l_i)  (the row logsumexp, (N, Bq))

so the (Tq, Tk) score and probability matrices never exist; only O and L leave the forward.
The autograd Function saves exactly q, k, v, o and L (shape (..., Tq), in the accumulator
dtype: fp32, or float64 for float64 inputs).

Causal (top-left aligned, like `F.scaled_dot_product_attention(is_causal=True)`: query t sees
keys 0..t): for the query tile [qs, qe) every key >= qe is masked, so the key loop stops at qe
(fully masked tiles are never computed), and only a tile that crosses the diagonal (its last key
> qs) builds a mask. Key 0 is visible to every query, so the running max is finite after the
first tile and exp(-inf - m) = 0 handles the masked entries.

Backward by recomputation from L (FA2, Algorithm 2), with D = rowsum(dO * O) (N, Tq):

    P  = exp(s Q K^T - L)       dV = P^T dO       dP = dO V^T
    dS = P * (dP - D)           dQ = s dS K       dK = s dS^T Q

evaluated one key tile at a time against all queries that can see it (Tq x Bk slabs, so backward
memory is O(Tq Bk) too); dK_j, dV_j are written once, dQ accumulates over key tiles.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Any

import torch

from lmperf.errors import SpecError

DEFAULT_BLOCK = 64
MIN_BLOCK = 16


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulator dtype: float64 for float64 inputs, float32 for everything else."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _no_autocast(device_type: str) -> Any:
    """Autocast off inside the kernel (it would round the fp32 tile matmuls down); else a no-op."""
    try:
        enabled = torch.is_autocast_enabled(device_type)
    except (TypeError, RuntimeError):  # device types autocast does not know (meta, ...)
        return nullcontext()
    return torch.autocast(device_type, enabled=False) if enabled else nullcontext()


def _above_diagonal(q0: int, q1: int, k0: int, k1: int, device: torch.device) -> torch.Tensor:
    """Bool (q1-q0, k1-k0): True where key index > query index (the causally masked entries)."""
    rows = torch.arange(q0, q1, device=device)[:, None]
    cols = torch.arange(k0, k1, device=device)[None, :]
    return cols > rows


def flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                  block_q: int = DEFAULT_BLOCK, block_k: int = DEFAULT_BLOCK,
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiled forward on (N, Tq, d), (N, Tk, d), (N, Tk, dv); returns o (N, Tq, dv) in q's dtype
    and L (N, Tq) in the accumulator dtype."""
    n, tq, d = q.shape
    tk, dv = k.shape[1], v.shape[2]
    acc_t = _acc_dtype(q.dtype)
    scale = 1.0 / math.sqrt(d)
    kf, vf = k.to(acc_t), v.to(acc_t)  # no copy for fp32 inputs
    o = torch.empty(n, tq, dv, dtype=q.dtype, device=q.device)
    lse = torch.empty(n, tq, dtype=acc_t, device=q.device)
    for qs in range(0, tq, block_q):
        qe = min(qs + block_q, tq)
        qi = q[:, qs:qe].to(acc_t) * scale  # (N, bq, d); the scale is folded into Q once
        m = torch.full((n, qe - qs), float("-inf"), dtype=acc_t, device=q.device)
        l = torch.zeros(n, qe - qs, dtype=acc_t, device=q.device)
        acc = torch.zeros(n, qe - qs, dv, dtype=acc_t, device=q.device)
        # Causal: keys >= qe are masked for every query of the tile, so those tiles are skipped.
        k_stop = min(tk, qe) if is_causal else tk
        for ks in range(0, k_stop, block_k):
            ke = min(ks + block_k, k_stop)
            s = torch.bmm(qi, kf[:, ks:ke].transpose(1, 2))  # (N, bq, bk)
            if is_causal and ke - 1 > qs:  # the tile crosses the diagonal
                s = s.masked_fill(_above_diagonal(qs, qe, ks, ke, q.device), float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))  # finite: key 0 is in the first tile
            p = torch.exp(s - m_new[..., None])  # (N, bq, bk)
            alpha = torch.exp(m - m_new)  # rescales what was accumulated under the old max
            l = alpha * l + p.sum(dim=-1)
            acc = alpha[..., None] * acc + torch.bmm(p, vf[:, ks:ke])
            m = m_new
        o[:, qs:qe] = (acc / l[..., None]).to(q.dtype)
        lse[:, qs:qe] = m + torch.log(l)
    return o, lse


def _backward_tile(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
                   lse: torch.Tensor, delta: torch.Tensor, mask: torch.Tensor | None,
                   scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One key tile against the queries that see it: q, do (N, nq, .), k, v (N, bk, .), lse,
    delta (N, nq), mask (nq, bk) or None. Returns the contributions (dq (N, nq, d), dk, dv)."""
    s = torch.bmm(q, k.transpose(1, 2)) * scale  # (N, nq, bk)
    if mask is not None:
        s = s.masked_fill(mask, float("-inf"))
    p = torch.exp(s - lse[..., None])  # the forward's probabilities, recomputed; masked -> 0
    dv = torch.bmm(p.transpose(1, 2), do)  # (N, bk, dv)
    dp = torch.bmm(do, v.transpose(1, 2))  # (N, nq, bk)
    ds = p * (dp - delta[..., None])
    dq = torch.bmm(ds, k) * scale  # (N, nq, d)
    dk = torch.bmm(ds.transpose(1, 2), q) * scale  # (N, bk, d)
    return dq, dk, dv


def flash_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                   lse: torch.Tensor, do: torch.Tensor, is_causal: bool,
                   block_k: int = DEFAULT_BLOCK) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv (accumulator dtype) from the saved (N, T, .) tensors, L (N, Tq) and dO."""
    n, tq, d = q.shape
    tk = k.shape[1]
    acc_t = _acc_dtype(q.dtype)
    scale = 1.0 / math.sqrt(d)
    qf, kf, vf, dof = (t.to(acc_t) for t in (q, k, v, do))
    delta = (dof * o.to(acc_t)).sum(dim=-1)  # D = rowsum(dO * O), (N, Tq)
    dq = torch.zeros(n, tq, d, dtype=acc_t, device=q.device)
    dk = torch.zeros(n, tk, d, dtype=acc_t, device=q.device)
    dv = torch.zeros(n, tk, v.shape[2], dtype=acc_t, device=q.device)
    for ks in range(0, tk, block_k):
        ke = min(ks + block_k, tk)
        q0 = ks if is_causal else 0  # causal: queries before ks see none of these keys
        if q0 >= tq:
            break  # this tile and all later ones are seen by no query: their grads stay 0
        mask = _above_diagonal(q0, tq, ks, ke, q.device) if is_causal else None
        dq_j, dk[:, ks:ke], dv[:, ks:ke] = _backward_tile(qf[:, q0:], kf[:, ks:ke], vf[:, ks:ke],
                                                          dof[:, q0:], lse[:, q0:], delta[:, q0:],
                                                          mask, scale)
        dq[:, q0:] += dq_j
    return dq, dk, dv


def _flat(x: torch.Tensor) -> torch.Tensor:
    """(..., T, d) -> (N, T, d), a view when the layout allows it."""
    return x.reshape(-1, x.shape[-2], x.shape[-1])


class FlashAttentionTorch(torch.autograd.Function):
    """Autograd Function: saves exactly (q, k, v, o, L), L the row logsumexp (..., Tq).

    Called as the course's tests call it, `FlashAttentionTorch.apply(q, k, v, is_causal)` (or
    without `is_causal`: False); the trailing tile sizes keep their
    defaults (autograd drops the trailing None gradients of arguments that were not passed).
    """

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                is_causal: bool = False, block_q: int = DEFAULT_BLOCK,
                block_k: int = DEFAULT_BLOCK) -> torch.Tensor:
        with _no_autocast(q.device.type):
            o, lse = flash_forward(_flat(q), _flat(k), _flat(v), bool(is_causal), block_q, block_k)
        o = o.reshape(*q.shape[:-1], v.shape[-1])  # (..., Tq, dv)
        lse = lse.reshape(q.shape[:-1])  # (..., Tq)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal, ctx.block_k = bool(is_causal), block_k
        return o

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, o, lse = ctx.saved_tensors
        with _no_autocast(q.device.type):
            dq, dk, dv = flash_backward(_flat(q), _flat(k), _flat(v), _flat(o),
                                        lse.reshape(-1, lse.shape[-1]), _flat(do),
                                        ctx.is_causal, ctx.block_k)
        return (dq.reshape(q.shape).to(q.dtype), dk.reshape(k.shape).to(k.dtype),
                dv.reshape(v.shape).to(v.dtype), None, None, None)


def flash_attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          is_causal: bool = False, block_q: int = DEFAULT_BLOCK,
                          block_k: int = DEFAULT_BLOCK) -> torch.Tensor:
    """FlashAttention-2 attention output (..., Tq, dv) in q's dtype, differentiable.

    Shapes are assumed valid (`lmperf.kernels.get("flash-torch")` checks them); block sizes must
    be >= 16 and raise SpecError otherwise.
    """
    for name, b in (("block_q", block_q), ("block_k", block_k)):
        if isinstance(b, bool) or not isinstance(b, int) or b < MIN_BLOCK:
            raise SpecError(f"flash-torch {name} must be an integer >= {MIN_BLOCK}, got {b!r}")
    return FlashAttentionTorch.apply(q, k, v, bool(is_causal), block_q, block_k)
