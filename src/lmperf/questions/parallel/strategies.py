"""The strategies of `lmperf dist train` by name: model wrapper + optimizer, ready to step.

`build(name, model, ...)` returns a `Setup`: the module to run forward on, the optimizer, what
to call after backward (`sync`), how to get the full parameters back (a collective), the
autocast context, and how to release everything (before the next strategy and before exit).

`analytic_messages` and `analytic_bus_bytes`: each strategy's communication per step and rank,
from the model's parameters, to compare with the bytes the profiler counted.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, ContextManager

import torch
import torch.nn as nn

from lmperf.names import ADAMW_ON
from lmperf.questions.parallel.ops import DTYPES
from lmperf.questions.parallel.spec import SHARDED

# AdamW's implementation by device type: what `lmperf plan` simulates and --confirm runs
ADAMW: dict[str, dict[str, bool]] = {device: {name: True} for device, name in ADAMW_ON.items()}


@dataclass
class Setup:
    """A strategy ready to step (see the module docstring)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    sync: Callable[[], None]
    full_params: Callable[[], dict[str, torch.Tensor]]
    autocast: Callable[[], ContextManager]
    close: Callable[[], None]
    # the context a micro-batch that is not the step's last runs in, `sync` called after the
    # last only (torch DDP's no_sync; nothing for what syncs after backward); None: the
    # strategy synchronises after every micro-batch (its hooks all-reduce during backward)
    no_sync: Callable[[], ContextManager] | None = None
    # --- what a layout (layouts.py) sets; a data-parallel strategy keeps the defaults ---
    # the context each micro-batch's forward AND backward run in (loss_parallel under TP)
    context: Callable[[], ContextManager] = contextlib.nullcontext
    # a pipeline's schedule: (inputs, targets) -> the mean loss on the last stage, else None;
    # it runs every micro-batch's forward and backward (then no `model` forward is called)
    pipeline: Callable[[torch.Tensor, torch.Tensor], torch.Tensor | None] | None = None
    # (this rank's data-parallel replica, replicas): the rows of the global batch it trains on
    # (None: one replica per rank)
    replica: tuple[int, int] | None = None
    # {name: full gradient} on rank 0 ({} elsewhere; a collective): the step's gradients
    full_grads: Callable[[], dict[str, torch.Tensor]] | None = None
    # process group name -> mesh dimension, for the collective ledger
    groups: dict[str, str] = field(default_factory=dict)
    # record fields the layout adds (the pipeline's schedule and idle slots)
    record: dict = field(default_factory=dict)


def _named(module: nn.Module) -> Callable[[], dict[str, torch.Tensor]]:
    return lambda: {n: p.detach().clone() for n, p in module.named_parameters()}


def _autocast(device: torch.device, dtype: torch.dtype | None) -> Callable[[], ContextManager]:
    if dtype is None:
        return contextlib.nullcontext
    return lambda: torch.autocast(device_type=device.type, dtype=dtype)


def build(name: str, model: nn.Module, *, lr: float, bucket_mb: float, compute_dtype: str,
          device: torch.device) -> Setup:
    """Wrap `model` (already on `device`, identical on every rank) for strategy `name`."""
    from lmperf.questions.parallel import ddp, engines, zero

    flags = {"lr": lr, **ADAMW.get(device.type, {})}
    adamw = lambda params: torch.optim.AdamW(params, **flags)  # noqa: E731
    plain = lambda w: Setup(w, adamw(w.parameters()), w.finish_gradient_synchronization,  # noqa: E731
                            _named(w.module), contextlib.nullcontext, w.close,
                            no_sync=getattr(getattr(w, "ddp", None), "no_sync", None)
                            or (contextlib.nullcontext if name in ("naive", "flat") else None))
    if name == "single":
        return Setup(model, adamw(model.parameters()), lambda: None, _named(model),
                     contextlib.nullcontext, lambda: None)
    if name in ("naive", "flat", "overlap"):
        return plain({"naive": ddp.NaiveDDP, "flat": ddp.FlatDDP, "overlap": ddp.OverlapDDP}[name](model))
    if name == "bucketed":
        return plain(ddp.BucketedDDP(model, bucket_mb))
    if name == "torch-ddp":
        return plain(engines.TorchDDP(model, bucket_mb))
    if name in SHARDED:
        dtype = None if compute_dtype == "fp32" else DTYPES[compute_dtype]
        wrapped = engines.FSDP2(model, dtype, reshard=name == "fsdp2")
        return Setup(wrapped, adamw(wrapped.parameters()), wrapped.finish_gradient_synchronization,
                     wrapped.gather_full_params, _autocast(device, dtype), wrapped.close)
    if name == "zero1":
        wrapped = ddp.BucketedDDP(model, bucket_mb)
        opt = zero.ShardedOptimizer(wrapped.parameters(), torch.optim.AdamW, **flags)
        return Setup(wrapped, opt, wrapped.finish_gradient_synchronization, _named(model),
                     contextlib.nullcontext, wrapped.close, no_sync=wrapped.no_sync)
    if name == "torch-zero1":
        wrapped = engines.TorchDDP(model, bucket_mb)
        opt = engines.TorchZeRO1(wrapped.parameters(), torch.optim.AdamW, **flags)
        return Setup(wrapped, opt, wrapped.finish_gradient_synchronization, _named(model),
                     contextlib.nullcontext, wrapped.close, no_sync=wrapped.ddp.no_sync)
    raise ValueError(f"unknown strategy {name!r}")


def optimizer_state(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer state tensors THIS rank holds (sharded optimizers: their local part)."""
    local = getattr(optimizer, "local", None) or getattr(optimizer, "optim", None) or optimizer
    return [t for s in local.state.values() for t in s.values() if torch.is_tensor(t)]


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of optimizer state THIS rank holds (sharded optimizers: their local part)."""
    return tensor_bytes(optimizer_state(optimizer))


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # a DTensor's shard on this rank


def tensor_bytes(tensors) -> int:
    """Bytes held on this rank by `tensors` (DTensors: their local shard)."""
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors if t is not None)


def param_groups(model: nn.Module) -> dict[str, int]:
    """Trainable elements as FSDP2 groups them: 'blocks' (inside a ModuleList: its per-block
    groups) and 'total'. Tied weights count once."""
    in_blocks: set[int] = set()
    for sub in model.modules():
        if isinstance(sub, nn.ModuleList):
            in_blocks |= {id(p) for p in sub.parameters() if p.requires_grad}
    trainable = {id(p): p.numel() for p in model.parameters() if p.requires_grad}
    return {"blocks": sum(n for i, n in trainable.items() if i in in_blocks),
            "total": sum(trainable.values())}


def analytic_messages(name: str, groups: dict[str, int], *, compute_dtype: str = "fp32",
                      accum: int = 1) -> list[tuple[str, float]]:
    """(collective, S bytes) of every message strategy `name` sends per step of `accum`
    micro-batches (S as nccl-tests defines it: the whole array), from the model's trainable
    elements `groups`: once per step an all-reduce after backward (or under torch DDP's
    no_sync) and ZeRO-1's broadcast after the optimizer; per micro-batch the rest."""
    once = name in ("torch-ddp", "torch-zero1", "naive", "flat", "zero1")
    return [(c, s * (1 if once and c == "all_reduce" or c == "broadcast" else accum))
            for c, s in _messages(name, groups, compute_dtype)]


def _messages(name: str, groups: dict[str, int], compute_dtype: str) -> list[tuple[str, float]]:
    total = groups["total"]
    c = {"fp32": 4, "bf16": 2, "fp16": 2}[compute_dtype]
    if name == "single":
        return []
    if name in ("naive", "flat", "overlap", "bucketed", "torch-ddp"):
        return [("all_reduce", 4 * total)]
    if name in ("zero1", "torch-zero1"):  # + every parameter broadcast once from its owner
        return [("all_reduce", 4 * total), ("broadcast", 4 * total)]
    if name == "fsdp2":
        # blocks are resharded after forward (gathered again in backward); the root's own
        # parameters stay gathered from forward to backward (fully_shard's root default);
        # gradients are reduce-scattered in fp32 (the policy's reduce_dtype)
        blocks, root = groups["blocks"], total - groups["blocks"]
        return [("all_gather", c * (2 * blocks + root)), ("reduce_scatter", 4 * total)]
    if name == "torch-zero2":  # gathered once in forward, kept through backward
        return [("all_gather", c * total), ("reduce_scatter", 4 * total)]
    raise ValueError(f"unknown strategy {name!r}")


# How a backend runs a collective, where that differs from what it is asked for.
EMULATED: dict[str, dict[str, str]] = {"gloo": {"reduce_scatter": "all_reduce"}}


def analytic_bus_bytes(messages: list[tuple[str, float]], n: int, backend: str | None = None) -> float:
    """Bytes each rank sends per step on a ring for `messages`: S x busbw factor (all-reduce
    2(n-1)/n, all-gather and reduce-scatter (n-1)/n, broadcast 1). With `backend`, each
    collective is costed as that backend runs it (gloo: reduce_scatter as an all-reduce)."""
    from lmperf.estimate.formulas import bus_factor

    if n == 1:
        return 0.0
    run_as = EMULATED.get(backend or "", {})
    return sum(size * bus_factor(run_as.get(c, c), n) for c, size in messages)
