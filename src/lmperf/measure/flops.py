"""FLOPs per step: counted with torch.utils.flop_counter, and the analytic 6N + attention formula.

Analytic count for the reference LM (B batch, T sequence, C d_model, F d_ff, L layers, V vocab),
counting a multiply-add as 2 FLOPs:
    matmul parameters  N = L * (4 C^2 + 3 C F) + C V     (q, k, v, out; w1, w2, w3; lm_head;
                                                           the embedding is a lookup, not a matmul)
    forward            2 N B T + L * 4 B T^2 C            (QK^T and PV over the full T x T square:
                                                           the naive kernel computes masked entries)
    backward           2 x forward                         (a gradient for each matmul operand)
so forward + backward = 6 N B T + 12 L B T^2 C.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch.utils.flop_counter import FlopCounterMode

BACKWARD_MODES = ("forward-backward", "train-step")


@dataclass(frozen=True)
class FlopEstimate:
    """Analytic FLOPs per step, split into the matmul (6N) part and the attention part."""

    matmul: int
    attention: int

    @property
    def total(self) -> int:
        return self.matmul + self.attention


def matmul_params(d_model: int, num_layers: int, d_ff: int, vocab_size: int) -> int:
    """Parameters that take part in matmuls (excludes the embedding table and norm weights)."""
    return num_layers * (4 * d_model * d_model + 3 * d_model * d_ff) + d_model * vocab_size


def analytic_flops(d_model: int, num_layers: int, d_ff: int, vocab_size: int, batch: int,
                   seq: int, mode: str) -> FlopEstimate:
    """FLOPs of one step of the reference LM in `mode` (optimizer FLOPs are not counted)."""
    passes = 3 if mode in BACKWARD_MODES else 1  # forward, plus 2x forward for backward
    n = matmul_params(d_model, num_layers, d_ff, vocab_size)
    matmul = passes * 2 * n * batch * seq
    attention = passes * num_layers * 4 * batch * seq * seq * d_model
    return FlopEstimate(matmul=matmul, attention=attention)


def count_flops(fn: Callable[[], object]) -> tuple[int, dict[str, int]]:
    """Run `fn` under FlopCounterMode; return total FLOPs and FLOPs per aten op name.

    Ops without a registered formula count as 0 (e.g. the CPU kernel behind
    F.scaled_dot_product_attention), so callers must check what was counted.
    """
    with FlopCounterMode(display=False) as counter:
        fn()
    per_op: dict[str, int] = {}
    for op, n in counter.get_flop_counts().get("Global", {}).items():
        per_op[str(op)] = per_op.get(str(op), 0) + int(n)
    return int(counter.get_total_flops()), per_op


def attention_flops_counted(per_op: dict[str, int]) -> int:
    """FLOPs the counter attributed to fused scaled-dot-product-attention kernels."""
    return sum(n for op, n in per_op.items() if "scaled_dot_product" in op)
