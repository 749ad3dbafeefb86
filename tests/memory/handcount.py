"""The hand count of one block's saved tensors, and the tiny model and batch it is for."""

from __future__ import annotations

import torch

from lmperf.model import TransformerLM

# B batch, T tokens, C d_model, H heads, F d_ff; V vocab. Small, and every size distinct.
B, T, C, H, F, V, L = 2, 8, 16, 2, 32, 50, 2
BT, BTC, BTF, BHT, BHTT = B * T, B * T * C, B * T * F, B * H * T, B * H * T * T


def hand_count_block(attention: str = "naive", mixed: bool = False) -> list[tuple[str, int, int]]:
    """Every distinct storage one block saves, from its ops: (what, elements, bytes per element).

    Derived from transformer.py, not from a measurement: RMSNorm squares its (fp32) input
    (`pow` keeps x), takes rsqrt (keeps its result), multiplies x by it (keeps both: already
    counted) and by the weight (keeps the normalised x and the weight: a parameter). A linear
    keeps its input and `weight.t()` (a parameter). RoPE multiplies by cos/sin buffers (kept, not
    counted) and stacks (keeps nothing). Naive attention: QK^T keeps q and k, the division by
    sqrt(D) keeps nothing, `where` keeps the mask, amax keeps its input and result, exp its
    result, the division by the row sum keeps both, PV keeps the probabilities and v (made
    contiguous). SDPA keeps q, k, v (a view of v's projection), output and logsumexp. The
    output projection keeps the (B, T, C) copy of the heads. SwiGLU: sigmoid keeps its result,
    h * s keeps h (and s), the product with w3 x keeps both factors, w2 keeps the product.
    Under bf16 autocast each projection keeps its own bf16 cast of its input, and the attention
    and SwiGLU tensors are bf16; RMSNorm stays fp32.
    """
    a = 2 if mixed else 4
    rows = [("ln1: input x (fp32)", BTC, 4), ("ln1: rsqrt", BT, 4), ("ln1: normalised x", BTC, 4)]
    rows += ([("ln1 out: bf16 cast for q", BTC, 2), ("for k", BTC, 2), ("for v", BTC, 2)] if mixed
             else [("ln1 out (q, k, v projections' input)", BTC, 4)])
    rows += [("q after RoPE", BTC, a), ("k after RoPE", BTC, a)]
    if attention == "naive":
        rows += [("causal mask (bool)", T * T, 1), ("masked scores", BHTT, a), ("row max", BHT, a),
                 ("exp", BHTT, a), ("row sum", BHT, a), ("probabilities", BHTT, a),
                 ("v contiguous", BTC, a)]
    else:
        rows += [("v (projection output)", BTC, a), ("sdpa output", BTC, a),
                 ("logsumexp (fp32)", BHT, 4)]
    rows += [("heads -> (B, T, C) copy (output_proj input)", BTC, a)]
    rows += [("ln2: input x (fp32)", BTC, 4), ("ln2: rsqrt", BT, 4), ("ln2: normalised x", BTC, 4)]
    rows += ([("ln2 out: bf16 cast for w1", BTC, 2), ("for w3", BTC, 2)] if mixed
             else [("ln2 out (w1, w3 input)", BTC, 4)])
    rows += [("h = w1 x", BTF, a), ("sigmoid(h)", BTF, a), ("h * sigmoid(h)", BTF, a),
             ("w3 x", BTF, a), ("(h * sigmoid(h)) * w3 x", BTF, a)]
    return rows


def tiny(attention: str = "naive", layers: int = L, **kw) -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(V, 16, C, layers, H, F, attention=attention, **kw)


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (B, T), generator=g), torch.randint(0, V, (B, T), generator=g)
