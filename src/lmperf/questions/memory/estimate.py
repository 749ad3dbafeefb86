"""Analytic training memory of the reference LM: parameters, gradients, AdamW state, activations.

Every term is derived op by op (B batch, T context, C d_model, H heads, F d_ff, L layers, V
vocab; p, a, r, l the bytes of the parameter, matmul, residual-stream and log-probability
dtypes) in docs/commands/memory.md, "The analytic terms, derived", and the exact ones are
counted on real tensors in the tests. The sum of the terms is the explanation, not the answer:
it is not an upper bound (it misses the optimizer's temporaries) and it counts terms that never
live together. `lmperf memory --estimate` reports the simulated peak instead (simulate.py) and
shows these terms beside it (estimate_sim.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from lmperf.errors import SpecError
from lmperf.validate import checkpoint_every, checkpoint_policy
from lmperf.model.presets import ModelConfig
from lmperf.runtime.precision import REGIMES, Regime


def block_matmul_params(c: ModelConfig) -> int:
    """Matmul weights of one block: q and out C x C, k and v C x Hkv D (C x C without GQA),
    w1, w2, w3 C x F."""
    C = c.d_model
    kv = C // c.num_heads * (c.num_kv_heads or c.num_heads)  # Hkv * D
    return 2 * C * C + 2 * C * kv + 3 * C * c.d_ff


def param_count(c: ModelConfig) -> int:
    """Parameter elements of the reference LM (embedding, blocks, final norm, lm_head unless
    it is the embedding's, tied)."""
    C, V = c.d_model, c.vocab_size
    head = 0 if c.tie_embeddings else C * V
    return V * C + c.num_layers * (block_matmul_params(c) + 2 * C) + C + head


def param_tensors(c: ModelConfig) -> int:
    """Parameter tensors: embedding, 9 per block (2 norms, q, k, v, out, w1, w2, w3), ln_final,
    lm_head (none of its own when tied)."""
    return (2 if c.tie_embeddings else 3) + 9 * c.num_layers


@dataclass(frozen=True)
class MemoryEstimate:
    """The estimate, term by term, in bytes (MiB = 2**20, GiB = 2**30 in the tables).

    `activation_terms` spells out `activation_bytes` (summed over all blocks and the head);
    `block_bytes` is one block's saved activations (without checkpointing).
    """

    mode: str
    regime: str
    attention: str
    device: str
    batch: int
    context: int
    checkpoint_group: str | int  # the policy (lmperf.validate.checkpoint_policy's canonical)
    params: int
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    weight_copy_bytes: int
    activation_bytes: int
    block_bytes: int
    recompute_bytes: int
    transient_bytes: int
    residual_bytes: int
    activation_terms: dict[str, int] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        """The sum of every term, as if all were alive at once (not an upper bound, and not the
        peak: see the module docstring)."""
        return (self.param_bytes + self.grad_bytes + self.optimizer_bytes + self.weight_copy_bytes
                + self.activation_bytes + self.recompute_bytes + self.transient_bytes)

    @property
    def step_bytes(self) -> int:
        """What one step adds on top of what it starts with (parameters, and AdamW state after
        the first step): gradients, saved tensors, recompute and transient."""
        return self.total_bytes - self.param_bytes - self.optimizer_bytes

    @property
    def saved_bytes(self) -> int:
        """What autograd keeps from forward to backward: activations + autocast weight copies."""
        return self.activation_bytes + self.weight_copy_bytes

def estimate(config: ModelConfig, batch: int, context: int, regime: str | Regime = "fp32",
             attention: str | None = None, mode: str = "train-step",
             checkpoint_group: str | int = "none", device: str = "cpu") -> MemoryEstimate:
    """Estimate the memory of one step of the reference LM, allocating nothing.

    `attention` defaults to the config's; `checkpoint_group` is the checkpointing policy (none,
    full, every-K or G blocks per group, any spelling `checkpoint_policy` accepts; op has no
    closed form: the simulation answers it); `device` ('cpu' or 'cuda') selects autocast's op
    lists. The other arguments come checked (a RunSpec's); raises SpecError for op or an
    unknown policy.
    """
    regime = REGIMES[regime] if isinstance(regime, str) else regime
    attention = attention or config.attention
    policy = checkpoint_group = checkpoint_policy(checkpoint_group)
    if policy == "op":
        raise SpecError("the analytic terms have no closed form for op checkpointing (what its "
                        "policy saves depends on the op order): the simulated step answers it")
    B, T, C, H, F, L, V = (batch, context, config.d_model, config.num_heads, config.d_ff,
                           config.num_layers, config.vocab_size)
    BT, BTC = B * T, B * T * C
    p = regime.param_dtype.itemsize
    mixed = regime.autocast_dtype is not None
    a = regime.autocast_dtype.itemsize if mixed else p
    r = 4 if mixed else p
    loss_b = 4 if mixed else p

    n = param_count(config)
    training = mode != "forward"
    grads = n * p if training else 0
    optimizer = 2 * n * p + 4 * param_tensors(config) if mode == "train-step" else 0

    # One block, term by term (see the module docstring).
    norms = 2 * (8 * BTC + 4 * BT)
    norm_outputs = 5 * a * BTC if mixed else 2 * r * BTC
    qk = 2 * a * BTC
    if attention == "naive" and mixed and device == "cuda":  # exp and sum in fp32 there
        attn = 2 * a * BTC + T * T + (2 * a + 4) * B * H * T * T + (a + 4) * B * H * T
    elif attention == "naive":
        attn = 2 * a * BTC + T * T + 3 * a * B * H * T * T + 2 * a * B * H * T
    else:
        attn = 3 * a * BTC + 4 * B * H * T  # v (view), output, attention-output copy, logsumexp
    ffn = 5 * a * B * T * F
    block = norms + norm_outputs + qk + attn + ffn
    block_copies = a * block_matmul_params(config) if mixed else 0
    head_copies = a * C * V if mixed else 0

    terms: dict[str, int] = {}
    # groups of `group` blocks (full: 1); every-K checkpoints L // K blocks, one at a time
    group = 0 if policy == "none" or checkpoint_every(policy) else (
        1 if policy == "full" else min(policy, L))  # type: ignore[type-var]
    kept = L - L // checkpoint_every(policy) if checkpoint_every(policy) else L  # plain blocks
    recompute = 0
    if training:
        if group:
            terms["checkpointed group inputs"] = math.ceil(L / group) * r * BTC
            recompute = group * (block + block_copies)
        else:
            if kept < L:
                terms["checkpointed block inputs"] = (L - kept) * r * BTC
                recompute = block + block_copies
            terms["blocks: norms (fp32)"] = kept * norms
            terms["blocks: norm outputs / casts"] = kept * norm_outputs
            terms["blocks: q, k"] = kept * qk
            terms[f"blocks: attention ({attention})"] = kept * attn
            terms["blocks: SwiGLU"] = kept * ffn
        terms["ln_final + lm_head input"] = 8 * BTC + 4 * BT + (a if mixed else r) * BTC
        terms["loss: log-probabilities"] = loss_b * BT * V + loss_b
    # Autocast's weight cache holds a cast of every weight (leaves requiring grad), with or
    # without grad mode; checkpointed blocks' casts are rebuilt in recompute (in `recompute`).
    copies = (0 if group and training else (kept if training else L) * block_copies) + head_copies
    transient = max((a + loss_b) * BT * V, 4 * a * B * H * T * T if attention == "naive" else 0)
    return MemoryEstimate(
        mode=mode, regime=regime.name, attention=attention, device=device, batch=B, context=T,
        checkpoint_group=checkpoint_group, params=n, param_bytes=n * p, grad_bytes=grads,
        optimizer_bytes=optimizer, weight_copy_bytes=copies,
        activation_bytes=sum(terms.values()), block_bytes=block, recompute_bytes=recompute,
        transient_bytes=transient, residual_bytes=r * BTC, activation_terms=terms)
