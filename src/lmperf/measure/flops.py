"""FLOPs per step: counted with torch.utils.flop_counter, and the analytic 6N + attention formula.

Analytic count for the reference LM (B batch, T sequence, C d_model, F d_ff, L layers, V vocab),
counting a multiply-add as 2 FLOPs:
    matmul parameters  N = L * (4 C^2 + 3 C F) + C V     (q, k, v, out; w1, w2, w3; lm_head;
                                                           the embedding is a lookup, not a matmul)
    forward            2 N B T + L * 4 B P C              (QK^T and PV over P query-key pairs)
    backward           2 x forward                         (a gradient for each matmul operand)
so forward + backward = 6 N B T + 12 L B P C. P = T^2 counts the full square, as the naive
kernel and torch's counter compute it (masked entries included); P = T^2 / 2 is the causal
convention (FlashAttention's benchmark halves the causal FLOPs the same way).

TFLOP/s and MFU of the reference LM use ONE convention whatever `--attention` runs
(`FLOPS_CONVENTION`; why: docs/concepts.md, "One FLOP convention"): the counter counts the step
with attention left out (`no_attention` stands in for the kernel, on the meta device) and
`attention_flops` adds the causal term.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.nn as nn
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


FLOPS_CONVENTION = ("model FLOPs: a multiply-add is 2 FLOPs, backward = 2 x forward (no "
                    "recomputation counted), causal attention counted over half the T x T score "
                    "square (FlashAttention's convention) whatever --attention computes")
"""The convention of the reference LM's TFLOP/s and MFU, printed with them."""
COUNTED_CONVENTION = ("as torch.utils.flop_counter counts the model's aten ops (a fused or "
                      "Triton attention kernel without a FLOP formula counts 0)")
"""The convention of a user model's figures, where lmperf cannot tell what the attention is."""


def attention_flops(d_model: int, num_layers: int, batch: int, seq: int, mode: str,
                    causal: bool = True) -> int:
    """FLOPs of QK^T and PV over one step: 4 B P C per layer forward (P query-key pairs: T^2 / 2
    when `causal`, else T^2), x3 with the backward."""
    passes = 3 if mode in BACKWARD_MODES else 1  # forward, plus 2x forward for backward
    full = passes * num_layers * 4 * batch * seq * seq * d_model
    return full // 2 if causal else full


def analytic_flops(d_model: int, num_layers: int, d_ff: int, vocab_size: int, batch: int,
                   seq: int, mode: str, causal: bool = False) -> FlopEstimate:
    """FLOPs of one step of the reference LM in `mode` (optimizer FLOPs are not counted).

    `causal=False` counts attention's full square (what the naive kernel and the counter
    compute); `causal=True` is `FLOPS_CONVENTION`'s half square."""
    passes = 3 if mode in BACKWARD_MODES else 1  # forward, plus 2x forward for backward
    n = matmul_params(d_model, num_layers, d_ff, vocab_size)
    matmul = passes * 2 * n * batch * seq
    return FlopEstimate(matmul=matmul,
                        attention=attention_flops(d_model, num_layers, batch, seq, mode, causal))


def no_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A FLOP-free stand-in for an attention kernel (q, k, v: (B, H, T, D) -> (B, H, T, D)),
    for counting the rest of a step: the output depends on all three inputs, so the backward
    still reaches (and counts) the q, k and v projections; an add has no FLOP formula."""
    return q + k + v


@contextlib.contextmanager
def meta_view(model: nn.Module) -> Iterator[nn.Module]:
    """Hold `model` shape-only for the duration: every parameter and buffer slot of every
    submodule (each module once, shared ones included) holds a meta tensor of the same shape,
    dtype and `requires_grad` (tied tensors stay tied), so a step runs no arithmetic and
    allocates nothing; the model's own tensors go back on exit, also when the step raised.
    Not `torch.func.functional_call`: it swaps a shared submodule's slot once per path and
    restores the already-swapped meta tensor last (pytorch/pytorch#164759, torch 2.13)."""
    swapped: list[tuple[dict, str, torch.Tensor]] = []  # (slot table, name, the model's tensor)
    metas: dict[int, torch.Tensor] = {}  # id(the model's tensor) -> its meta stand-in
    try:
        for module in model.modules():  # each module once, shared ones included
            for table in (module._parameters, module._buffers):
                for name, tensor in list(table.items()):
                    if tensor is None:
                        continue
                    if id(tensor) not in metas:
                        meta = torch.empty_like(tensor, device="meta")
                        metas[id(tensor)] = (
                            nn.Parameter(meta, requires_grad=tensor.requires_grad)
                            if isinstance(tensor, nn.Parameter) else meta)
                    swapped.append((table, name, tensor))
                    table[name] = metas[id(tensor)]
        yield model
    finally:
        for table, name, tensor in reversed(swapped):
            table[name] = tensor


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one step as a run reports them: the figure, how it was obtained, on which
    convention, and (reference LM) the analytic figure on the same convention."""

    flops: int
    source: str
    convention: str
    analytic: int | None = None


def reference_step_flops(counted: int, attention_left_out: bool, d_model: int, num_layers: int,
                         d_ff: int, vocab_size: int, batch: int, seq: int, mode: str) -> StepFlops:
    """The reference LM's FLOPs per step on `FLOPS_CONVENTION`: `counted` (the counter's figure
    with attention left out, `attention_left_out`) plus the causal attention term. A count that
    includes the implementation's own attention (a real step, when the meta device failed)
    stays as counted and says so: it does not compare across --attention."""
    est = analytic_flops(d_model, num_layers, d_ff, vocab_size, batch, seq, mode, causal=True)
    if attention_left_out:
        return StepFlops(counted + est.attention,
                         "torch.utils.flop_counter on the meta device, attention left out, + "
                         "analytic causal attention", FLOPS_CONVENTION, est.total)
    return StepFlops(counted, "torch.utils.flop_counter on a real step (attention as the "
                     "implementation computes it)", COUNTED_CONVENTION, est.total)


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
