"""The reference LM: the CS336 "basics" Transformer, state-dict compatible with the course's.

Pre-norm blocks (RMSNorm computed in fp32), causal multi-head attention with RoPE on
interleaved pairs, SwiGLU feed-forward, no biases, untied `lm_head`. Parameter names and shapes
match the course's `BasicsTransformerLM`, so its checkpoints load with `strict=True`. Optional
Llama-3 features: grouped-query attention (`num_kv_heads`) and an lm_head tied to the embedding.
Shapes: B batch, T sequence, C d_model, H heads, Hkv K/V heads, D = C // H, F d_ff, V vocab.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from lmperf.model.attention import AttentionFn, make_attention
from lmperf.model.checkpointing import block_spans
from lmperf.validate import checkpoint_policy, positive_int


def _trunc_normal(shape: tuple[int, ...], std: float) -> torch.Tensor:
    """A tensor drawn from N(0, std^2) truncated at +-3 std (the course's initialisation)."""
    return nn.init.trunc_normal_(torch.empty(shape), std=std, a=-3 * std, b=3 * std)


class Linear(nn.Module):
    """Bias-free linear map with weight (d_out, d_in), fan-in + fan-out truncated-normal init."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.weight = nn.Parameter(_trunc_normal((d_out, d_in), math.sqrt(2 / (d_in + d_out))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)  # (..., d_in) -> (..., d_out)

    def extra_repr(self) -> str:
        return f"d_in={self.weight.shape[1]}, d_out={self.weight.shape[0]}"


class Embedding(nn.Module):
    """Token embedding table (V, C), unit-std truncated-normal init."""

    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        self.weight = nn.Parameter(_trunc_normal((vocab_size, d_model), 1.0))

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(token_ids, self.weight)  # (B, T) -> (B, T, C)


class TiedHead(nn.Module):
    """lm_head tied to the token embedding: logits = x E^T, E the embedding's (V, C) weight.

    It registers no parameter: `weight` reads the embedding's, so the model has one Parameter
    (counted once by `parameters()`) and stays tied through `to_empty()` and `_apply` (the
    memory simulator's and op counter's), which give a Parameter registered in two modules two
    separate copies.
    """

    def __init__(self, embedding: Embedding):
        super().__init__()
        self._embedding = (embedding,)  # a tuple: not a submodule, so no second path to E

    @property
    def weight(self) -> nn.Parameter:
        return self._embedding[0].weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)  # (..., C) -> (..., V)


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32 whatever the input dtype, cast back to the input dtype.

    Squaring in fp16 overflows above |x| ~ 256, which is why the statistics are taken in fp32.
    """

    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        in_dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * x).to(in_dtype)


class RotaryEmbedding(nn.Module):
    """RoPE on interleaved pairs (x0, x1), (x2, x3), ... of each head's D features.

    cos/sin tables (T_max, D/2) are non-persistent buffers: they are not in the state dict and
    follow the module's device and `.to(dtype)`.
    """

    def __init__(self, context_length: int, head_dim: int, theta: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head dimension, got {head_dim}")
        inv_freq = theta ** -(torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(context_length, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", torch.cos(angles), persistent=False)  # (T_max, D/2)
        self.register_buffer("sin", torch.sin(angles), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Rotate x (..., T, D) by position 0..T-1."""
        t = x.shape[-2]
        cos, sin = self.cos[:t], self.sin[:t]  # (T, D/2)
        x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)  # each (..., T, D/2)
        # Deliberately no cast of cos/sin to x.dtype: under autocast the rotated q, k come out
        # fp32 as in the course's model, and autocast casts them again at the score matmul.
        return torch.stack((cos * x1 - sin * x2, sin * x1 + cos * x2), dim=-1).flatten(-2)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention; the score/softmax/combine kernel is pluggable.
    With `num_kv_heads` < num_heads (grouped-query attention) each K/V head serves
    num_heads / num_kv_heads consecutive query heads."""

    def __init__(self, d_model: int, num_heads: int, rope: RotaryEmbedding, attention: AttentionFn,
                 num_kv_heads: int | None = None):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} is not divisible by num_heads {num_heads}")
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_kv_heads <= 0 or num_heads % num_kv_heads:
            raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads "
                             f"{num_kv_heads} (grouped-query attention shares each K/V head "
                             "among a whole number of query heads)")
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = d_model // num_heads
        kv_dim = self.head_dim * num_kv_heads  # Hkv * D
        self.q_proj = Linear(d_model, d_model)
        self.k_proj = Linear(d_model, kv_dim)
        self.v_proj = Linear(d_model, kv_dim)
        self.output_proj = Linear(d_model, d_model)
        self.rope = rope  # shared by all layers; holds no parameters
        self.attention = attention

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, T, C) -> q (B, H, T, D); k, v (B, Hkv, T, D)
        q, k, v = (
            p(x).unflatten(-1, (-1, self.head_dim)).transpose(-3, -2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        q, k = self.rope(q), self.rope(k)
        if self.num_kv_heads != self.num_heads:
            # The simple way to GQA: copy each K/V head to its query heads, (B, Hkv, T, D) ->
            # (B, H, T, D), so every attention kernel runs unchanged (flash-triton has not run
            # on a GPU yet). Costs H/Hkv copies of K and V; a GQA-aware kernel would read them once.
            group = self.num_heads // self.num_kv_heads
            k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
        y = self.attention(q, k, v)  # (B, H, T, D)
        return self.output_proj(y.transpose(-3, -2).flatten(-2))  # (B, T, C)


class SwiGLU(nn.Module):
    """w2(silu(w1 x) * w3 x), with silu written as x * sigmoid(x) as in the course."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w1 = Linear(d_model, d_ff)
        self.w2 = Linear(d_ff, d_model)
        self.w3 = Linear(d_model, d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.w1(x)  # (B, T, F)
        return self.w2(h * torch.sigmoid(h) * self.w3(x))


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(ln1(x)), then + ffn(ln2(.))."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, rope: RotaryEmbedding,
                 attention: AttentionFn, num_kv_heads: int | None = None):
        super().__init__()
        self.ln1 = RMSNorm(d_model)
        self.attn = CausalSelfAttention(d_model, num_heads, rope, attention, num_kv_heads)
        self.ln2 = RMSNorm(d_model)
        self.ffn = SwiGLU(d_model, d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


class TransformerLM(nn.Module):
    """Token ids (B, T) -> next-token logits (B, T, V).

    Args:
        vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta: the
            course's hyperparameters; `context_length` is the longest sequence the model accepts.
        attention: name of the attention implementation (see `lmperf.model.attention.ATTENTION`).
        num_kv_heads: K/V heads of grouped-query attention, dividing num_heads (None: num_heads).
        tie_embeddings: lm_head uses the token embedding's weight (`TiedHead`).
        checkpoint: activation checkpointing, 'none' by default; see `set_checkpointing`.
            Not a `ModelConfig` field (a user's factory never receives it): the commands
            switch it on after building, through `set_checkpointing`.
    """

    def __init__(self, vocab_size: int, context_length: int, d_model: int, num_layers: int,
                 num_heads: int, d_ff: int, rope_theta: float = 10000.0, attention: str = "naive",
                 checkpoint: str | int = "none", num_kv_heads: int | None = None,
                 tie_embeddings: bool = False):
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("context_length", context_length),
                            ("d_model", d_model), ("num_layers", num_layers),
                            ("num_heads", num_heads), ("d_ff", d_ff),
                            ("num_kv_heads", num_heads if num_kv_heads is None else num_kv_heads)):
            positive_int(name, value)  # SpecError, a ValueError
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} is not divisible by num_heads {num_heads}")
        self.vocab_size = vocab_size
        self.context_length = context_length
        self.attention_name = attention
        attn_fn = make_attention(attention)
        rope = RotaryEmbedding(context_length, d_model // num_heads, rope_theta)
        self.token_embeddings = Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(
            TransformerBlock(d_model, num_heads, d_ff, rope, attn_fn, num_kv_heads)
            for _ in range(num_layers)
        )
        self.ln_final = RMSNorm(d_model)
        self.lm_head = (TiedHead(self.token_embeddings) if tie_embeddings
                        else Linear(d_model, vocab_size))
        self.set_checkpointing(checkpoint)

    def set_checkpointing(self, policy: str | int) -> None:
        """Activation checkpointing by `policy` (`lmperf.validate.checkpoint_policy`'s values:
        'none', 'full', 'op', 'every-K' or G; 0 and 1 mean none and full).

        While grad is enabled, each checkpointed span of blocks (`block_spans`) runs under
        `torch.utils.checkpoint` (non-reentrant): groups of G blocks (full: G = 1) keep only
        the span's input (B, T, C) and recompute its activations during backward; every-K
        does so for one block in K; op saves the outputs of the matmuls and attention it lists
        and recomputes the rest of each block. Parameters, state dict and results are unchanged.
        Raises ValueError (a SpecError) for a value that is no policy.
        """
        self.checkpoint = checkpoint_policy(policy)

    def _run_blocks(self, x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """Blocks start..stop-1 in order: (B, T, C) -> (B, T, C)."""
        for i in range(start, stop):
            x = self.layers[i](x)
        return x

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        t = token_ids.shape[-1]
        if t > self.context_length:
            raise ValueError(f"sequence length {t} exceeds context_length {self.context_length}")
        x = self.token_embeddings(token_ids)  # (B, T, C)
        n = len(self.layers)
        if self.checkpoint != "none" and torch.is_grad_enabled():
            for start, stop, context_fn in block_spans(self.checkpoint, n):
                # use_reentrant=False: works with inputs that need no grad, keeps
                # saved_tensors_hooks outside the span working, and is what torch recommends.
                x = (self._run_blocks(x, start, stop) if context_fn is None else
                     checkpoint(self._run_blocks, x, start, stop, use_reentrant=False,
                                context_fn=context_fn))
        else:
            x = self._run_blocks(x, 0, n)
        return self.lm_head(self.ln_final(x))  # (B, T, V)
