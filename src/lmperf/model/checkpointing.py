"""Activation checkpointing switched on a built model, whichever kind it is: the reference LM's
policies (none, full, op, every-K, groups of G blocks: `lmperf.validate.checkpoint_policy`), or
a transformers model's own switch (full or none).

`op` is torchtitan's selective per-op policy (torchtitan 0.3,
`distributed/activation_checkpoint.py`, `SelectiveAC`), applied per block with torch's
`create_selective_checkpoint_contexts`: the outputs of the ops in `save_ops()` are saved, except
every second matmul, and everything else is recomputed in backward.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
from torch.utils.checkpoint import (CheckpointPolicy, create_selective_checkpoint_contexts,
                                    noop_context_fn)

from lmperf.errors import SpecError
from lmperf.validate import checkpoint_every, checkpoint_policy

# A span of consecutive blocks: (start, stop, context_fn); context_fn None runs them plainly,
# else under torch.utils.checkpoint with that context_fn.
Span = tuple[int, int, Callable | None]


@functools.cache
def save_ops() -> frozenset:
    """The ops whose outputs `op` saves, torchtitan 0.3's `_get_default_save_ops`: the compute-
    intensive ops of torch's partitioner (mm, addmm, bmm, _scaled_mm, convolution, the CUDA
    SDPA kernels, ...), the other SDPA variants, max (the amax of float8's scales), flex
    attention, linear, topk and the two collectives whose outputs are costly to make again
    (reduce_scatter_tensor, all_to_all_single); the optional ones torchtitan resolves by name
    (inductor's compiled code, custom attention, DeepEP) are left out where this torch lacks
    them, as torchtitan does."""
    from torch._functorch.partitioners import get_default_op_list

    ops = {op.default for op in get_default_op_list().compute_intensive_ops}
    aten, c10d = torch.ops.aten, torch.ops._c10d_functional
    for owner, name in ((aten, "_scaled_dot_product_cudnn_attention"),
                        (aten, "_scaled_dot_product_attention_math"),
                        (aten, "_scaled_dot_product_fused_attention_overrideable"),
                        (aten, "max"), (aten, "linear"), (aten, "topk"),
                        (c10d, "reduce_scatter_tensor"), (c10d, "all_to_all_single")):
        if hasattr(owner, name):
            ops.add(getattr(owner, name).default)
    flex = getattr(torch._higher_order_ops, "flex_attention", None)
    return frozenset(ops | ({flex} if flex is not None else set()))


MM_OPS = (torch.ops.aten.mm.default, torch.ops.aten.linear.default)


def op_policy() -> Callable[..., CheckpointPolicy]:
    """A fresh policy function for one checkpointed block's forward (and its recompute):
    torchtitan's rule. Matmuls are counted apart in the forward and in the recompute, so the
    recompute makes the same decisions; the 2nd, 4th, ... matmul of a block is recomputed
    (in the reference LM: k, the output projection and w3), the 1st, 3rd, ... saved (q, v, w1,
    w2). Left out, as the reference LM has neither: torchtitan's forced recompute of the MoE
    router's matmul shapes and its saving of CUDA -> CPU copies (MoE's all-to-all sizes)."""
    counts = {"forward": 0, "recompute": 0}
    ops = save_ops()

    def policy(ctx, func, *args, **kwargs) -> CheckpointPolicy:
        mode = "recompute" if ctx.is_recompute else "forward"
        if func in MM_OPS:
            counts[mode] += 1
            if counts[mode] % 2 == 0:  # every second matmul: recomputed
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in ops else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def op_context():
    """`op`'s context_fn for torch.utils.checkpoint: one per checkpointed call."""
    return create_selective_checkpoint_contexts(op_policy())


def block_spans(policy: str | int, num_blocks: int) -> list[Span]:
    """The blocks 0..num_blocks-1 cut into spans for `policy` (canonical): groups of G (full:
    G = 1; a group larger than the model is one group), one span per block under `op`, or, for
    every-K, the K-th, 2K-th, ... block checkpointed alone and the others run plainly
    (torchtitan 0.2 counts blocks from 1 and checkpoints those whose count K divides)."""
    n = num_blocks
    if policy == "none":
        return [(0, n, None)] if n else []
    if policy == "op":
        return [(i, i + 1, op_context) for i in range(n)]
    k = checkpoint_every(policy)
    if k is not None:
        spans: list[Span] = []
        start = 0
        for i in range(k - 1, n, k):
            spans += ([(start, i, None)] if i > start else []) + [(i, i + 1, noop_context_fn)]
            start = i + 1
        return spans + ([(start, n, None)] if start < n else [])
    group = 1 if policy == "full" else policy
    return [(s, min(s + group, n), noop_context_fn) for s in range(0, n, group)]


def set_checkpointing(model: torch.nn.Module, policy: str | int) -> None:
    """Turn the model's activation checkpointing to `policy` (any spelling `checkpoint_policy`
    accepts); SpecError if the model cannot apply it. A transformers model checkpoints every
    layer or none: 'full' is its `activation_checkpointing_enable()`
    (`gradient_...` before transformers 5), non-reentrant as the reference LM's."""
    policy = checkpoint_policy(policy)
    setter = getattr(model, "set_checkpointing", None)
    if setter is None:
        if policy in ("none", "full") and getattr(model, "supports_gradient_checkpointing", False):
            name = "activation" if hasattr(model, "activation_checkpointing_enable") else "gradient"
            if policy == "full":
                getattr(model, f"{name}_checkpointing_enable")({"use_reentrant": False})
            else:
                getattr(model, f"{name}_checkpointing_disable")()
            return
        if policy != "none":
            raise SpecError(f"{type(model).__name__} cannot checkpoint {policy}: op, every-K and "
                            "groups are the reference LM's; a transformers model checkpoints "
                            "full (every layer) or none")
        return
    try:
        setter(policy)
    except ValueError as exc:
        raise SpecError(str(exc)) from None
