"""Jobs the dist tests launch through lmperf's own torchrun launcher (the worker imports them).

`StrategyCheck` runs every strategy class on a toy model that has what breaks naive data
parallelism: a frozen parameter, tied weights (the output layer IS the embedding), norms that
stay replicated, and blocks in a ModuleList (fsdp2's per-block groups). Each item trains the
wrapped model and a single-process reference (the global batch, the same init) side by side and
returns the largest parameter difference; rank 0's payload becomes the record.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from lmperf.questions.parallel.ops import DTYPES
from lmperf.questions.parallel.reference import compare
from lmperf.model.transformer import Embedding, Linear, RMSNorm

VOCAB, D, FF, B, T = 50, 16, 32, 4, 6  # B sequences per rank


class ToyModel(nn.Module):
    """ids (B, T) -> logits (B, T, VOCAB); head tied to the embedding, one frozen parameter."""

    def __init__(self):
        super().__init__()
        self.embed = Embedding(VOCAB, D)
        self.norm = RMSNorm(D)
        self.blocks = nn.ModuleList(nn.Sequential(Linear(D, FF), nn.ReLU(), Linear(FF, D))
                                    for _ in range(2))
        self.frozen_scale = nn.Parameter(torch.full((D,), 1.5), requires_grad=False)
        self.final = RMSNorm(D)
        self.head = Linear(D, VOCAB)
        self.head.weight = self.embed.weight  # tied: one Parameter, used twice

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.embed(ids))
        for block in self.blocks:
            x = x + block(x)
        return self.head(self.final(x * self.frozen_scale))


@dataclass(frozen=True)
class StrategyCheck:
    """Items 'strategy:dtype' (dtype: the fsdp2 compute dtype, fp32 for the others)."""

    kind: ClassVar[str] = "dist"
    runner: ClassVar[str] = "lmperf.core.torchrun:run_job"
    worker: ClassVar[str] = "tests.parallel.jobs:check_item"

    world_size: int
    checks: tuple[str, ...]
    steps: int = 3
    backend: str = "gloo"
    device: str = "cpu"
    threads: int = 1
    timeout_s: float = 120.0

    def to_dict(self) -> dict:
        return asdict(self)

    to_full_dict = to_dict

    @classmethod
    def from_dict(cls, data: dict) -> "StrategyCheck":
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})

    def items(self) -> list[str]:
        return list(self.checks)

    def item_spec(self, item: str) -> dict:
        return {"what": "check", "check": item, "world_size": self.world_size}

    def with_items(self, items: list[str]) -> "StrategyCheck":
        return StrategyCheck(**{**self.to_dict(), "checks": tuple(items)})

    def label(self) -> str:
        return "strategy checks"


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of `step`: (n x B, T) ids and next-token targets."""
    gen = torch.Generator().manual_seed(100 + step)
    tokens = torch.randint(0, VOCAB, (dist.get_world_size() * B, T + 1), generator=gen)
    return tokens[:, :-1], tokens[:, 1:]


def _loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def _optimizer(name: str, params, low_precision: bool):
    """AdamW in fp32 (its state is what zero1 shards); SGD with a low-precision compute dtype,
    whose update is proportional to the gradient (AdamW's normalised update turns a rounding
    difference in a near-zero gradient into a full step)."""
    from lmperf.questions.parallel.engines import TorchZeRO1
    from lmperf.questions.parallel.zero import ShardedOptimizer

    if name == "zero1":
        params = list(params)
        half = len(params) // 2  # the second half joins later: add_param_group after __init__
        opt = ShardedOptimizer(params[:half], torch.optim.AdamW, lr=1e-2)
        opt.add_param_group({"params": params[half:], "lr": 2e-2})
        return opt
    if name == "torch-zero1":
        return TorchZeRO1(params, torch.optim.AdamW, lr=1e-2)
    if low_precision:
        return torch.optim.SGD(params, lr=0.05)
    return torch.optim.AdamW(params, lr=1e-2)


def _reference_optimizer(name: str, model: nn.Module, low_precision: bool):
    params = list(model.parameters())
    if name == "zero1":
        half = len(params) // 2
        return torch.optim.AdamW([{"params": params[:half]}, {"params": params[half:], "lr": 2e-2}],
                                 lr=1e-2)
    return torch.optim.SGD(params, lr=0.05) if low_precision else torch.optim.AdamW(params, lr=1e-2)


def _wrap(name: str, model: nn.Module, dtype: torch.dtype | None):
    from lmperf.questions.parallel import BucketedDDP, FSDP2, FlatDDP, NaiveDDP, OverlapDDP, TorchDDP

    wrappers = {"naive": NaiveDDP, "flat": FlatDDP, "overlap": OverlapDDP,
                "bucketed": lambda m: BucketedDDP(m, 0.001), "torch-ddp": lambda m: TorchDDP(m, 0.001),
                "zero1": OverlapDDP, "torch-zero1": lambda m: TorchDDP(m, 1.0),
                "fsdp2": lambda m: FSDP2(m, compute_dtype=dtype)}
    return wrappers[name](model)


def _full(wrapped: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter in full (a collective for the sharded wrappers)."""
    if hasattr(wrapped, "gather_full_params"):
        return wrapped.gather_full_params()
    return {k: v.detach().clone() for k, v in wrapped.module.named_parameters()}


def check_item(job: StrategyCheck, item: str, ctx) -> dict | None:
    """Train strategy `item` and the reference for job.steps steps; rank 0 returns the diffs."""
    name, dtype_name = item.split(":")
    dtype = None if dtype_name == "fp32" else DTYPES[dtype_name]
    low = dtype is not None
    rank, n = ctx.rank, ctx.world_size
    torch.manual_seed(0)
    reference = ToyModel()  # rank 0's initial weights (every rank builds it, only 0 uses it)
    torch.manual_seed(rank)
    wrapped = _wrap(name, ToyModel(), dtype)  # every other rank starts different: the wrapper
    initial = _full(wrapped)                  # must broadcast rank 0's weights
    broadcast = all(torch.equal(initial[k], v) for k, v in reference.named_parameters())
    tied = wrapped.module.head.weight is wrapped.module.embed.weight
    opt = _optimizer(name, wrapped.parameters(), low)
    ref_opt = _reference_optimizer(name, reference, low)
    grads_ok = True
    for step in range(job.steps):
        inputs, targets = _batch(step)
        mine = slice(rank * B, (rank + 1) * B)
        _loss(wrapped(inputs[mine]), targets[mine]).backward()
        wrapped.finish_gradient_synchronization()
        for p in wrapped.parameters():  # the course's check: gradients shaped and typed as params
            if p.grad is not None:
                grads_ok &= p.grad.shape == p.shape and p.grad.dtype == p.dtype
        opt.step()
        opt.zero_grad(set_to_none=True)
        if name == "fsdp2" and low:  # fully_shard computes with every parameter cast
            cast = {k: v.to(dtype) for k, v in reference.named_parameters()}
            logits = torch.func.functional_call(reference, cast, (inputs,))
        else:
            logits = reference(inputs)
        _loss(logits, targets).backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
    full = _full(wrapped)
    wrapped.close()
    frozen = torch.equal(full["frozen_scale"], torch.full((D,), 1.5))
    tol = (1e-6, 1e-5) if not low else ((1e-3, 1e-3) if dtype_name == "bf16" else (2e-4, 1e-3))
    result = compare(full, {k: v.detach() for k, v in reference.named_parameters()}, *tol)
    results = [None] * n if rank == 0 else None
    dist.gather_object({"broadcast": broadcast, "tied": tied, "grads": grads_ok,
                        "frozen": frozen, **result}, results, dst=0)
    del wrapped, opt
    return {"metrics": {"ranks": results}} if rank == 0 else None
