"""Tensor parallelism with sequence and loss parallelism, as torchtitan applies it to Llama
(torchtitan/models/llama3/parallelize.py: apply_tp), on the reference LM or a pipeline stage of it.

Megatron's split through DTensor's `parallelize_module`: q, k, v, w1 and w3 column-wise (heads
and hidden units over the tensor-parallel ranks), the attention's output projection and w2
row-wise; the embedding row-wise over the vocabulary and lm_head column-wise, its logits left
sharded over the vocabulary for `loss_parallel`. Between the blocks the activations are split
over the sequence (SequenceParallel on the RMSNorms; `PrepareModuleInput` gathers the sequence
before attention and the MLP; the row-wise outputs are reduce-scattered back to it). The
attention splits q, k, v into heads with the head dimension, so each rank runs its H / t heads
unchanged (model/transformer.py).
"""

from __future__ import annotations

import torch.nn as nn


def torch_modules(model: nn.Module) -> None:
    """Swap the reference LM's own Linear and Embedding for torch's (the same Parameter, the
    same F.linear / F.embedding): torch's parallel styles accept nn.Linear and nn.Embedding only.
    In place; parameter names are unchanged."""
    from lmperf.model.transformer import Embedding, Linear

    for parent in list(model.modules()):
        for name, sub in list(parent.named_children()):
            if type(sub) is Linear:
                new = nn.Linear(sub.weight.shape[1], sub.weight.shape[0], bias=False,
                                device="meta")
            elif type(sub) is Embedding:
                new = nn.Embedding(*sub.weight.shape, device="meta")
            else:
                continue
            new.weight = sub.weight  # the meta weight is dropped, the model's kept
            setattr(parent, name, new)


def blocks(module: nn.Module) -> list[nn.Module]:
    """The transformer blocks of the model (a ModuleList) or of a pipeline stage (a ModuleDict
    keyed by the block's index in the model)."""
    layers = module.layers
    return list(layers.values()) if isinstance(layers, nn.ModuleDict) else list(layers)


def parallelize(module: nn.Module, tp_mesh) -> None:
    """Apply torchtitan's TP plan (see the module docstring) to the reference LM or a pipeline
    stage (`pipeline.Stage`: the embedding, the final norm and lm_head where the stage has them)
    over the 1-D mesh `tp_mesh`, in place. The logits come out as a DTensor sharded over the
    vocabulary: compute the loss under `torch.distributed.tensor.parallel.loss_parallel()`."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel,
                                                   parallelize_module)

    torch_modules(module)
    outer = {}
    if getattr(module, "token_embeddings", None) is not None:
        # ids (B, T) replicated -> embeddings (B, T/t, C), sequence-sharded
        outer["token_embeddings"] = RowwiseParallel(input_layouts=Replicate(),
                                                    output_layouts=Shard(1))
    if getattr(module, "lm_head", None) is not None:
        outer["ln_final"] = SequenceParallel()
        # (B, T/t, C) -> logits (B, T, V/t), left a DTensor for loss_parallel
        outer["lm_head"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1),
                                           use_local_output=False)
    if outer:
        parallelize_module(module, tp_mesh, outer)
    def gather() -> PrepareModuleInput:  # (B, T/t, C) -> (B, T, C)
        return PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))

    for block in blocks(module):
        parallelize_module(block, tp_mesh, {
            "ln1": SequenceParallel(),
            "attn": gather(),
            "attn.q_proj": ColwiseParallel(),  # -> (B, T, C/t): H/t heads
            "attn.k_proj": ColwiseParallel(),
            "attn.v_proj": ColwiseParallel(),
            "attn.output_proj": RowwiseParallel(output_layouts=Shard(1)),  # -> (B, T/t, C)
            "ln2": SequenceParallel(),
            "ffn": gather(),
            "ffn.w1": ColwiseParallel(),  # -> (B, T, F/t)
            "ffn.w3": ColwiseParallel(),
            "ffn.w2": RowwiseParallel(output_layouts=Shard(1)),
        })
