"""FLOPs of the three attention steps: analytic, and counted by torch.utils.flop_counter.

Per forward step of the reference LM (B batch, T sequence, H heads, D head dim, C = H*D,
L layers), counting a multiply-add as 2 FLOPs:
    scores        QK^T: 2*B*H*T*T*D per layer, plus the 1/sqrt(D) scaling: B*H*T*T
    softmax       max, subtract, exp, sum, divide: 5*B*H*T*T per layer
    final matmul  PV: 2*B*H*T*T*D per layer
The counter only has formulas for matmul-like ops, so it counts the softmax (and the scaling)
as 0: that difference is the point of the course's question (e).
"""

from __future__ import annotations

import torch

from lmperf.measure.flops import count_flops
from lmperf.model.attention import NaiveAttention
from lmperf.questions.profile.range_names import FINAL_MATMUL, SCORES, SOFTMAX


def attention_flops(batch: int, seq: int, heads: int, head_dim: int, layers: int) -> dict[str, dict[str, int]]:
    """{range name: {'analytic': FLOPs, 'counted': FLOPs}} per forward step, all layers."""
    bhtt = batch * heads * seq * seq
    analytic = {
        SCORES: layers * (2 * bhtt * head_dim + bhtt),
        SOFTMAX: layers * 5 * bhtt,
        FINAL_MATMUL: layers * 2 * bhtt * head_dim,
    }
    attn = NaiveAttention()
    shape = (batch, heads, seq, head_dim)
    with torch.device("meta"):  # shapes only: nothing is allocated
        q, k, v = (torch.empty(shape) for _ in range(3))
        mask = torch.ones(seq, seq, dtype=torch.bool).tril()
        scores = attn.scores(q, k, mask)
        probs = attn.softmax(scores)
        counted = {
            SCORES: count_flops(lambda: attn.scores(q, k, mask))[0],
            SOFTMAX: count_flops(lambda: attn.softmax(scores))[0],
            FINAL_MATMUL: count_flops(lambda: attn.combine(probs, v))[0],
        }
    return {name: {"analytic": analytic[name], "counted": layers * counted[name]} for name in analytic}
