"""Closed forms of parallel training, without torch: nccl-tests' bus factors, a model's Shape,
tensor parallelism's split of the parameters and the activations a rank saves. The formulas
worked through: docs/commands/dist.md, "--estimate"."""

from __future__ import annotations

from dataclasses import dataclass


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw / algbw for `collective` over `n` ranks.

    all_reduce 2(n-1)/n (a reduce-scatter then an all-gather: every byte crosses 2(n-1) links
    out of n); all_gather, reduce_scatter and all_to_all (n-1)/n (S the whole array: each rank
    holds, sends or receives S/n per peer); broadcast 1 (all S leaves the root).
    """
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if collective == "broadcast":
        return 1.0
    raise ValueError(f"unknown collective {collective!r}")


def bandwidths(size_bytes: int, time_s: float, collective: str, n: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (GB = 1e9 bytes), nccl-tests' definitions: algbw = S / t."""
    algbw = size_bytes / time_s / 1e9
    return algbw, algbw * bus_factor(collective, n)


@dataclass(frozen=True)
class Shape:
    """What the estimates need of a model: parameters P and the widths;
    `num_kv_heads` 0 is plain multi-head attention, else the K/V heads of grouped-query attention."""

    name: str
    params: int
    d_model: int
    d_ff: int
    num_layers: int
    num_heads: int = 0
    vocab_size: int = 0
    ffn_only: bool = False
    num_kv_heads: int = 0
    numels: tuple[int, ...] = ()  # each parameter tensor's elements, in the model's order

    @property
    def param_tensors(self) -> int:
        """Parameter tensors (9 per block and 3 around them when not counted)."""
        return len(self.numels) or 9 * self.num_layers + 3

    def owner_share(self, n: int) -> float:
        """The largest share of the parameters one of `n` ranks owns when each tensor goes, in
        order, to the least-loaded rank (lmperf's ShardedOptimizer): 1 / n when not counted."""
        if not self.numels or n <= 1:
            return 1 / max(n, 1)
        loads = [0] * n
        for k in self.numels:
            loads[loads.index(min(loads))] += k
        return max(loads) / sum(loads)

    @property
    def replicated_params(self) -> int:
        """Parameters tensor parallelism keeps whole on every device: the RMSNorm weights
        (two per block and the final one); none in the FFN-only model."""
        return 0 if self.ffn_only else 2 * self.num_layers * self.d_model + self.d_model


def ffn_only_shape(d_model: int, d_ff: int, num_layers: int) -> Shape:
    """The course's accounting model: per block two Linear layers d_model -> d_ff -> d_model
    (no attention, embeddings or output layer): P = 2 x d_model x d_ff x layers."""
    return Shape(f"ffn d={d_model} ff={d_ff} L={num_layers}", 2 * d_model * d_ff * num_layers,
                 d_model, d_ff, num_layers, ffn_only=True)


def tp_params(shape: Shape, t: int) -> float:
    """Parameters one device of a tensor-parallel group of `t` holds: (P - P_rep) / t + P_rep."""
    return (shape.params - shape.replicated_params) / t + shape.replicated_params


def activation_bytes(shape: Shape, tokens: float, t: int = 1, a: int = 2) -> float:
    """Bytes saved for backward on one device of a `t`-way tensor-parallel group whose micro-batch
    has `tokens` tokens, activations in an a-byte dtype (bf16 autocast: a = 2): the saved
    activations and autocast's weight copies (saved_activation_bytes + weight_copy_bytes)."""
    return saved_activation_bytes(shape, tokens, t, a) + weight_copy_bytes(shape, t, a)


def saved_activation_bytes(shape: Shape, tokens: float, t: int = 1, a: int = 2) -> float:
    """The activations one device saves (see activation_bytes), without weight copies: per
    token, the FFN-only model's block inputs (C) and first outputs (F / t); the LM's a(t), term by
    term in docs/commands/dist.md ("--estimate"; `lmperf memory --estimate`'s terms at t = 1)."""
    C, F, L = shape.d_model, shape.d_ff, shape.num_layers
    if shape.ffn_only:
        return L * tokens * (C + F / t) * a
    H, V = shape.num_heads, shape.vocab_size
    block = tokens * (16 * C + 8 + 5 * a * C + (5 * a * C + 4 * H + 5 * a * F) / t)
    head = tokens * (8 * C + 4 + a * C + 4 * V / t) + 4
    return L * block + head


def weight_copy_bytes(shape: Shape, t: int = 1, a: int = 2) -> float:
    """Autocast's a-byte copies of the matmul weights, saved for backward, split as the weights
    are: a (L (4 C^2 + 3 C F) + C V) / t (none in the FFN-only model, counted in fp32 there);
    with grouped-query attention k and v are C x Hkv D, so 4 C^2 is 2 C^2 + 2 C Hkv D."""
    if shape.ffn_only:
        return 0.0
    C, F = shape.d_model, shape.d_ff
    kv = C * shape.num_kv_heads // shape.num_heads if shape.num_kv_heads else C  # Hkv D
    return a * (shape.num_layers * (2 * C * C + 2 * C * kv + 3 * C * F)
                + C * shape.vocab_size) / t
