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

`exact=True` (what the course adapter `get_fsdp` uses in fp32) makes every sharded weight's
gradient bitwise equal to single-process training on the global batch: its owner computes it
from the Linear's input and output-gradient rows (the Embedding's ids), all-gathered in batch
order (why, and when it holds: docs/commands/dist.md, "FSDP bit for bit").
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

    def __init__(self, weight: nn.Parameter, compute_dtype: torch.dtype | None,
                 exact: bool = False):
        self.rank, self.n = dist.get_rank(), dist.get_world_size()
        self.exact = exact
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

    def owned_chunk(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's chunk of the full-shape `full` (a gradient every rank computed alike),
        divided by n (the average over ranks), as an fp32 (param dtype) gradient."""
        flat = F.pad(full.reshape(-1), (0, self.chunk * self.n - self.numel))
        return flat[self.rank * self.chunk:(self.rank + 1) * self.chunk].div(self.n).to(self.param.dtype)

    def reduce_scatter(self, grad: torch.Tensor) -> torch.Tensor:
        """This rank's chunk of the MEAN over ranks of `grad` (shape), as an fp32 (param
        dtype) gradient for `param`; communicated in grad's dtype (the compute dtype)."""
        flat = F.pad(grad.reshape(-1), (0, self.chunk * self.n - self.numel))
        out = torch.empty(self.chunk, dtype=flat.dtype, device=flat.device)
        reduce_scatter_flat(out, flat.contiguous())
        return out.div_(self.n).to(self.param.dtype)


def gather_rows(t: torch.Tensor) -> torch.Tensor:
    """(rows, ...) on every rank -> (n x rows, ...), rank 0's rows first: the global batch's
    order when rank r holds the r-th slice of it. Every rank must pass the same shape."""
    t = t.contiguous()
    out = torch.empty((dist.get_world_size() * t.shape[0], *t.shape[1:]), dtype=t.dtype,
                      device=t.device)
    all_gather_flat(out.view(-1), t.view(-1))
    return out


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
        if sharded.exact:  # the global batch's (n x tokens) rows, in its order, on every rank
            g, xs = gather_rows(g), gather_rows(xs)
            grad_w = sharded.owned_chunk(g.t() @ xs)  # the one-process GEMM over all tokens
        else:
            grad_w = sharded.reduce_scatter(g.t() @ xs)  # (out, in) -> this rank's mean chunk
        grad_b = None
        if bias is not None and ctx.needs_input_grad[3]:
            # exact: every rank holds the global sum / n, so the replicated all-reduce's mean
            # of n equal values (power-of-two n) returns it unchanged
            grad_b = (g.sum(0) / (sharded.n if sharded.exact else 1)).to(bias.dtype)
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
        if sharded.exact:  # the op autograd runs for F.embedding, on the global batch's rows
            grad = gather_rows(grad_out.reshape(-1, grad_out.shape[-1]))  # (n x tokens, C)
            full = torch.ops.aten.embedding_dense_backward(
                grad, gather_rows(ids.reshape(-1)), sharded.shape[0],
                -1 if ctx.padding_idx is None else ctx.padding_idx, False)  # (V, C)
            return None, sharded.owned_chunk(full), None, None
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
    returns {name: full fp32 tensor} with the unwrapped module's parameter names. `exact`:
    sharded weights' gradients bitwise equal to one process on the global batch (activations
    all-gathered instead of gradients reduce-scattered: see the module docstring).
    """

    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None,
                 exact: bool = False):
        super().__init__()
        broadcast_from_rank0(module)
        self.module = module
        self.compute_dtype = compute_dtype
        self.exact = exact
        self.world_size = dist.get_world_size()
        self.sharded: dict[int, ShardedWeight] = {}  # id(shard param) -> its ShardedWeight
        by_weight: dict[int, ShardedWeight] = {}  # id(original weight) -> shard (tied: one)
        for sub in module.modules():
            kind = shardable(sub)
            if kind is None:
                continue
            weight = sub._parameters["weight"]
            if id(weight) not in by_weight:
                by_weight[id(weight)] = ShardedWeight(weight, compute_dtype, exact)
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


# --- the course's adapter interface (its FSDP tests call these three) ---------------------------

def get_fsdp(module: nn.Module, compute_dtype: torch.dtype | None = None) -> FSDP:
    """The course's `get_fsdp`: lmperf's FSDP over `module`; exact in fp32 (compute_dtype None),
    so that its fp32 test may demand `torch.equal` with single-process training."""
    return FSDP(module, compute_dtype, exact=compute_dtype is None)


def fsdp_on_after_backward(fsdp_model: FSDP, optimizer: torch.optim.Optimizer) -> None:
    """The course's hook between backward and `optimizer.step()`: finish the gradient sync."""
    fsdp_model.finish_gradient_synchronization()


def fsdp_gather_full_params(fsdp_model: FSDP) -> dict[str, torch.Tensor]:
    """The course's `fsdp_gather_full_params`: {name: full fp32 tensor} (a collective)."""
    return fsdp_model.gather_full_params()
