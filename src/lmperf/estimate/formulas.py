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
        """The largest share of the parameters one of `n` ranks owns when each tensor, the
        largest first, goes to the least-loaded rank (torch's ZeroRedundancyOptimizer,
        `_partition_parameters`): 1 / n when not counted."""
        if not self.numels or n <= 1:
            return 1 / max(n, 1)
        loads = [0] * n
        for k in sorted(self.numels, reverse=True):
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
    """Bytes the course's FFN-only model saves for backward on one device of a `t`-way
    tensor-parallel group whose micro-batch has `tokens` tokens, in an a-byte dtype: per token
    and block its input (C, whole on every device) and first output (F / t). A full LM's saved
    bytes come from the simulation (`lmperf memory --estimate`, the plan)."""
    if not shape.ffn_only:
        raise ValueError("activation_bytes prices the FFN-only model; simulate a full LM")
    return shape.num_layers * tokens * (shape.d_model + shape.d_ff / t) * a
