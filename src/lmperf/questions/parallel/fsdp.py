"""A readable FSDP: Linear and Embedding weights sharded across ranks, gathered only when used.

Each rank keeps 1/n of every Linear and Embedding weight (flattened, padded to a multiple of n)
as an fp32 "master" shard, the Parameter the optimizer sees. A sharded module's forward
all-gathers the full weight (cast to `compute_dtype` BEFORE the all-gather, so the message is
half the size in bf16/fp16), computes, and lets the full weight go; a Linear's backward
all-gathers it again (it was not kept) to compute the input's gradient; the weight's gradient
(computed in `compute_dtype`) is reduce-scattered so each rank receives the mean of its shard's
gradient, cast to fp32. Everything else (norm weights, biases) stays replicated and its
gradients are all-reduced in `finish_gradient_synchronization()`.

Collectives here are blocking, so nothing overlaps (fsdp2 prefetches and overlaps). Tied
weights are one shard (one Parameter): both uses reduce-scatter into the same `.grad`, which
autograd sums. A weight with `requires_grad=False` is not sharded. With `compute_dtype` set,
run the forward under autocast too: the reference LM mixes dtypes inside attention.
"""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from lmperf.questions.parallel.ddp import broadcast_from_rank0
from lmperf.questions.parallel.ops import all_gather_flat, reduce_scatter_flat


class ShardedWeight:
    """One weight of shape `shape` split in n chunks of `chunk` elements; `param` is this
    rank's fp32 chunk (n * chunk >= numel: the last chunk is zero-padded)."""

    def __init__(self, weight: nn.Parameter, compute_dtype: torch.dtype | None):
        self.rank, self.n = dist.get_rank(), dist.get_world_size()
        self.shape, self.numel = weight.shape, weight.numel()
        self.chunk = math.ceil(self.numel / self.n)
        self.compute_dtype = compute_dtype or weight.dtype
        flat = F.pad(weight.detach().flatten(), (0, self.chunk * self.n - self.numel))
        self.param = nn.Parameter(flat[self.rank * self.chunk:(self.rank + 1) * self.chunk].clone())

    def gather(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The full weight (shape) in the compute dtype (or `dtype`), from every rank's chunk."""
        dtype = dtype or self.compute_dtype
        out = torch.empty(self.chunk * self.n, dtype=dtype, device=self.param.device)
        all_gather_flat(out, self.param.detach().to(dtype))  # cast first: fewer bytes on the wire
        return out[:self.numel].view(self.shape)

    def reduce_scatter(self, grad: torch.Tensor) -> torch.Tensor:
        """This rank's chunk of the MEAN over ranks of `grad` (shape), as an fp32 (param
        dtype) gradient for `param`; communicated in grad's dtype (the compute dtype)."""
        flat = F.pad(grad.reshape(-1), (0, self.chunk * self.n - self.numel))
        out = torch.empty(self.chunk, dtype=flat.dtype, device=flat.device)
        reduce_scatter_flat(out, flat.contiguous())
        return out.div_(self.n).to(self.param.dtype)


class _ShardedLinear(torch.autograd.Function):
    """y = x W^T (+ b) with W gathered in forward and gathered again in backward."""

    @staticmethod
    def forward(ctx, x, shard, sharded: ShardedWeight, bias):  # type: ignore[override]
        w = sharded.gather()  # (out, in) in the compute dtype; dropped when forward returns
        ctx.sharded = sharded
        ctx.save_for_backward(x, bias)
        return F.linear(x.to(w.dtype), w, None if bias is None else bias.to(w.dtype))

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        x, bias = ctx.saved_tensors
        sharded = ctx.sharded
        w = sharded.gather()  # the second all-gather: the full weight was not kept
        g = grad_out.to(w.dtype).reshape(-1, grad_out.shape[-1])  # (tokens, out)
        xs = x.to(w.dtype).reshape(-1, x.shape[-1])  # (tokens, in)
        grad_x = (g @ w).view(x.shape).to(x.dtype) if ctx.needs_input_grad[0] else None
        grad_w = sharded.reduce_scatter(g.t() @ xs)  # (out, in) -> this rank's mean chunk
        grad_b = g.sum(0).to(bias.dtype) if bias is not None and ctx.needs_input_grad[3] else None
        return grad_x, grad_w, None, grad_b


class _ShardedEmbedding(torch.autograd.Function):
    """Rows of W for the token ids; W gathered in forward only (backward needs the ids)."""

    @staticmethod
    def forward(ctx, ids, shard, sharded: ShardedWeight, padding_idx):  # type: ignore[override]
        ctx.sharded, ctx.padding_idx = sharded, padding_idx
        ctx.save_for_backward(ids)
        return F.embedding(ids, sharded.gather())  # (..., C) in the compute dtype

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        (ids,) = ctx.saved_tensors
        sharded = ctx.sharded
        grad_w = torch.zeros(sharded.shape, dtype=grad_out.dtype, device=grad_out.device)
        grad_w.index_add_(0, ids.reshape(-1), grad_out.reshape(-1, grad_out.shape[-1]))  # (V, C)
        if ctx.padding_idx is not None:
            grad_w[ctx.padding_idx] = 0
        return None, sharded.reduce_scatter(grad_w), None, None


def _linear_forward(module: nn.Module, sharded: ShardedWeight, x: torch.Tensor) -> torch.Tensor:
    return _ShardedLinear.apply(x, sharded.param, sharded, getattr(module, "bias", None))


def _embedding_forward(module: nn.Module, sharded: ShardedWeight, ids: torch.Tensor) -> torch.Tensor:
    return _ShardedEmbedding.apply(ids, sharded.param, sharded, getattr(module, "padding_idx", None))


def shardable(module: nn.Module) -> str | None:
    """'linear' or 'embedding' for a module whose weight this FSDP shards, else None: torch's
    Linear / Embedding, or a class named Linear / Embedding (the course's, lmperf's reference
    LM) with a 2-D trainable `weight` used as F.linear / F.embedding use it."""
    weight = getattr(module, "_parameters", {}).get("weight")
    if weight is None or weight.dim() != 2 or not weight.requires_grad:
        return None
    if isinstance(module, nn.Linear) or type(module).__name__ == "Linear":
        return "linear"
    if isinstance(module, nn.Embedding):
        return "embedding" if module.max_norm is None else None
    return "embedding" if type(module).__name__ == "Embedding" else None


class FSDP(nn.Module):
    """Fully sharded data parallel over `module` (see the module docstring).

    `parameters()` are the fp32 shards plus the replicated parameters (give them to the
    optimizer); `finish_gradient_synchronization()` after backward; `gather_full_params()`
    returns {name: full fp32 tensor} with the unwrapped module's parameter names.
    """

    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None):
        super().__init__()
        broadcast_from_rank0(module)
        self.module = module
        self.compute_dtype = compute_dtype
        self.world_size = dist.get_world_size()
        self.sharded: dict[int, ShardedWeight] = {}  # id(shard param) -> its ShardedWeight
        by_weight: dict[int, ShardedWeight] = {}  # id(original weight) -> shard (tied: one)
        for sub in module.modules():
            kind = shardable(sub)
            if kind is None:
                continue
            weight = sub._parameters["weight"]
            if id(weight) not in by_weight:
                by_weight[id(weight)] = ShardedWeight(weight, compute_dtype)
            sharded = by_weight[id(weight)]
            self.sharded[id(sharded.param)] = sharded
            sub.register_parameter("weight", sharded.param)
            forward = _linear_forward if kind == "linear" else _embedding_forward
            sub.forward = partial(forward, sub, sharded)  # an instance attribute wins over the class's
        self.replicated = [p for p in module.parameters()
                           if p.requires_grad and id(p) not in self.sharded]

    def forward(self, *args: object, **kwargs: object) -> object:
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        """All-reduce (mean) the replicated parameters' gradients; the shards' gradients were
        reduce-scattered during backward."""
        grads = [p.grad for p in self.replicated if p.grad is not None]
        if not grads:
            return
        flat = _flatten_dense_tensors(grads).div_(self.world_size)
        dist.all_reduce(flat)
        for g, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
            g.copy_(synced)

    @torch.no_grad()
    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """{name: full tensor} of every parameter (a collective: every rank must call it)."""
        out = {}
        for name, p in self.module.named_parameters():
            sharded = self.sharded.get(id(p))
            out[name] = (sharded.gather(p.dtype).clone() if sharded is not None
                         else p.detach().clone())
        return out

    def close(self) -> None:
        """Nothing in flight (every collective here is blocking)."""
