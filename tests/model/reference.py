"""An independent re-implementation of CS336's `BasicsTransformerLM` (2025) for the model tests.

Written deliberately differently from `lmperf.model.transformer` and importing nothing from
`lmperf`: attention loops over heads with an explicit `masked_fill(-inf)` mask and
`torch.softmax`, RoPE multiplies each interleaved pair by an explicit 2x2 rotation matrix whose
angles are computed in float64, RMSNorm divides by `sqrt` instead of multiplying by `rsqrt`, and
the embedding is plain indexing.

Parameter names and shapes follow the course's state dict, so the two models exchange weights with
`load_state_dict(strict=True)` in both directions.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn


def expected_shapes(vocab_size: int, d_model: int, num_layers: int, d_ff: int) -> dict[str, tuple]:
    """The course's state-dict keys and shapes, written out by hand."""
    shapes: dict[str, tuple] = {"token_embeddings.weight": (vocab_size, d_model)}
    for i in range(num_layers):
        p = f"layers.{i}."
        shapes[p + "ln1.weight"] = (d_model,)
        for proj in ("q_proj", "k_proj", "v_proj", "output_proj"):
            shapes[p + f"attn.{proj}.weight"] = (d_model, d_model)
        shapes[p + "ln2.weight"] = (d_model,)
        shapes[p + "ffn.w1.weight"] = (d_ff, d_model)
        shapes[p + "ffn.w2.weight"] = (d_model, d_ff)
        shapes[p + "ffn.w3.weight"] = (d_ff, d_model)
    shapes["ln_final.weight"] = (d_model,)
    shapes["lm_head.weight"] = (vocab_size, d_model)
    return shapes


def _holder(shape: tuple, scale: float) -> nn.Module:
    """A bare module owning one parameter called `weight` (only to get the course's key names)."""
    m = nn.Module()
    m.weight = nn.Parameter(torch.randn(shape) * scale)
    return m


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Upcast to fp32, divide by the root mean square, scale by w, cast back to x's dtype."""
    xf = x.float()
    rms = torch.sqrt((xf * xf).mean(dim=-1, keepdim=True) + eps)
    return ((xf / rms) * w).to(x.dtype)


def rotation_matrices(seq_len: int, d_k: int, theta: float) -> torch.Tensor:
    """R[p, i] = [[cos a, -sin a], [sin a, cos a]] with a = p * theta^(-2i/d_k); (T, d_k/2, 2, 2).

    Angles in float64 (the course builds its table in fp32; the difference is ~1e-7).
    """
    rows = []
    for p in range(seq_len):
        mats = []
        for i in range(d_k // 2):
            a = p * theta ** (-2.0 * i / d_k)
            c, s = math.cos(a), math.sin(a)
            mats.append([[c, -s], [s, c]])
        rows.append(mats)
    return torch.tensor(rows, dtype=torch.float64)


def rope(x: torch.Tensor, theta: float, pairing: str = "interleaved") -> torch.Tensor:
    """Rotate the last dim of x (..., T, d_k) at positions 0..T-1.

    pairing="interleaved" (the course's): pairs (x0, x1), (x2, x3), ...
    pairing="halves" (GPT-NeoX style, NOT the course's; used as a negative control): pairs
    (x_i, x_{i + d_k/2}).
    """
    t, d_k = x.shape[-2], x.shape[-1]
    r = rotation_matrices(t, d_k, theta).to(x.dtype)
    if pairing == "interleaved":
        pairs = x.reshape(*x.shape[:-1], d_k // 2, 2)  # (..., T, d_k/2, 2)
        out = torch.einsum("tiab,...tib->...tia", r, pairs)
        return out.reshape(x.shape)
    if pairing == "halves":
        pairs = torch.stack((x[..., : d_k // 2], x[..., d_k // 2:]), dim=-1)
        out = torch.einsum("tiab,...tib->...tia", r, pairs)
        return torch.cat((out[..., 0], out[..., 1]), dim=-1)
    raise ValueError(pairing)


class ReferenceLM(nn.Module):
    """Course-compatible LM; `variant` can switch on a known-wrong detail for negative controls.

    variant: None (faithful), "rope_halves" (wrong RoPE pairing), "heads_inner" (wrong head split,
    feature index = j * heads + head), "no_rope", "post_norm".
    """

    def __init__(self, vocab_size: int, context_length: int, d_model: int, num_layers: int,
                 num_heads: int, d_ff: int, rope_theta: float = 10000.0, variant: str | None = None,
                 scale: float = 0.3):
        super().__init__()
        self.context_length = context_length
        self.num_heads = num_heads
        self.theta = rope_theta
        self.variant = variant
        self.token_embeddings = _holder((vocab_size, d_model), 1.0)
        layers = []
        for _ in range(num_layers):
            layer = nn.Module()
            layer.ln1 = _holder((d_model,), 0.0)
            layer.ln2 = _holder((d_model,), 0.0)
            with torch.no_grad():  # norms' weights around 1, not exactly 1
                layer.ln1.weight.copy_(1 + 0.1 * torch.randn(d_model))
                layer.ln2.weight.copy_(1 + 0.1 * torch.randn(d_model))
            layer.attn = nn.Module()
            for proj in ("q_proj", "k_proj", "v_proj", "output_proj"):
                setattr(layer.attn, proj, _holder((d_model, d_model), scale))
            layer.ffn = nn.Module()
            layer.ffn.w1 = _holder((d_ff, d_model), scale)
            layer.ffn.w2 = _holder((d_model, d_ff), scale)
            layer.ffn.w3 = _holder((d_ff, d_model), scale)
            layers.append(layer)
        self.layers = nn.ModuleList(layers)
        self.ln_final = _holder((d_model,), 0.0)
        with torch.no_grad():
            self.ln_final.weight.copy_(1 + 0.1 * torch.randn(d_model))
        self.lm_head = _holder((vocab_size, d_model), scale)

    # -- pieces -------------------------------------------------------------------------------
    def _attention(self, attn: nn.Module, x: torch.Tensor) -> torch.Tensor:
        t, d_model = x.shape[-2], x.shape[-1]
        h = self.num_heads
        d_k = d_model // h
        q = x @ attn.q_proj.weight.T
        k = x @ attn.k_proj.weight.T
        v = x @ attn.v_proj.weight.T
        future = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
        outs = []
        for head in range(h):
            if self.variant == "heads_inner":
                idx = torch.arange(d_k) * h + head
            else:
                idx = torch.arange(head * d_k, (head + 1) * d_k)
            qh, kh, vh = q[..., idx], k[..., idx], v[..., idx]
            if self.variant != "no_rope":
                pairing = "halves" if self.variant == "rope_halves" else "interleaved"
                qh, kh = rope(qh, self.theta, pairing), rope(kh, self.theta, pairing)
            scores = (qh @ kh.transpose(-1, -2)) / math.sqrt(d_k)
            scores = scores.masked_fill(future, float("-inf"))
            outs.append(torch.softmax(scores, dim=-1) @ vh)
        if self.variant == "heads_inner":
            y = torch.stack(outs, dim=-1).flatten(-2)  # index j * h + head
        else:
            y = torch.cat(outs, dim=-1)  # index head * d_k + j
        return y @ attn.output_proj.weight.T

    @staticmethod
    def _ffn(ffn: nn.Module, x: torch.Tensor) -> torch.Tensor:
        a = x @ ffn.w1.weight.T
        gate = a * torch.sigmoid(a)
        return (gate * (x @ ffn.w3.weight.T)) @ ffn.w2.weight.T

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        assert token_ids.shape[-1] <= self.context_length
        x = self.token_embeddings.weight[token_ids]
        for layer in self.layers:
            if self.variant == "post_norm":
                x = rms_norm(x + self._attention(layer.attn, x), layer.ln1.weight)
                x = rms_norm(x + self._ffn(layer.ffn, x), layer.ln2.weight)
            else:
                x = x + self._attention(layer.attn, rms_norm(x, layer.ln1.weight))
                x = x + self._ffn(layer.ffn, rms_norm(x, layer.ln2.weight))
        return rms_norm(x, self.ln_final.weight) @ self.lm_head.weight.T
