"""The naive attention math: einsum scores, explicit mask, max-subtracted softmax, einsum with V.

It is the registry's "naive" kernel and the reference LM's default attention. It is a class with
three steps (scores, softmax, combine) so that the profiling layer can subclass it and put a
named range around each step without forking the model (`lmperf.questions.profile.annotate`).
"""

from __future__ import annotations

import math

import torch


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Max-subtracted softmax, written out as the course writes it (no fused kernel).

    Subtracting the row max keeps exp() from overflowing; a fully masked row would be NaN, which
    causal masking never produces (the diagonal is always kept).
    """
    shifted = x - torch.amax(x, dim=dim, keepdim=True)
    e = torch.exp(shifted)
    return e / torch.sum(e, dim=dim, keepdim=True)


class NaiveAttention:
    """Einsum scores, explicit mask, max-subtracted softmax, einsum with V.

    Called as (q, k, v, is_causal=True): causal by default because the reference LM calls its
    attention as (q, k, v); the registry's kernel passes `is_causal` explicitly.
    """

    name = "naive"

    def scores(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Scaled, masked scores (..., Tq, Tk); masked positions (mask False) are -inf."""
        s = torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(q.shape[-1])
        return torch.where(mask, s, float("-inf"))

    def softmax(self, scores: torch.Tensor) -> torch.Tensor:
        """Probabilities over the key axis, same shape as the scores."""
        return softmax(scores, dim=-1)

    def combine(self, probs: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The final matmul: probabilities (..., Tq, Tk) @ values (..., Tk, D)."""
        return torch.einsum("...qk,...kd->...qd", probs, v)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 is_causal: bool = True) -> torch.Tensor:
        """o (..., Tq, D); causal masking is top-left aligned (query i sees keys 0..i)."""
        if is_causal:
            # (Tq, Tk) lower-triangular: query i sees keys 0..i
            mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        else:
            mask = torch.ones((), dtype=torch.bool, device=q.device)  # broadcasts: nothing masked
        return self.combine(self.softmax(self.scores(q, k, mask)), v)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


_NAIVE = NaiveAttention()


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    is_causal: bool = False) -> torch.Tensor:
    """The registry's "naive" kernel: the reference model's attention math, o (..., Tq, d)."""
    return _NAIVE(q, k, v, is_causal)
