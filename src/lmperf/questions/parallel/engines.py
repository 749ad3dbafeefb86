"""torch's own engines behind the same interfaces as lmperf's readable strategies: DDP
(`TorchDDP`), FSDP2 (`FSDP2`: `fully_shard` on every block of every ModuleList and on the root)
and ZeroRedundancyOptimizer (`TorchZeRO1`).
"""

from __future__ import annotations

import warnings
from typing import Any, Iterable

import torch
import torch.nn as nn

from lmperf.questions.parallel.ddp import broadcast_from_rank0


def fsdp2_api() -> tuple[Any, Any] | None:
    """(fully_shard, MixedPrecisionPolicy) from wherever this torch has them (2.4, 2.5:
    torch.distributed._composable.fsdp; 2.6+: torch.distributed.fsdp), or None."""
    for where in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):
        try:
            module = __import__(where, fromlist=["fully_shard", "MixedPrecisionPolicy"])
            return module.fully_shard, module.MixedPrecisionPolicy
        except (ImportError, AttributeError):
            continue
    return None


class TorchDDP(nn.Module):
    """DistributedDataParallel with `bucket_size_mb` buckets (its reducer all-reduces them
    during backward); buffers are broadcast once, at construction."""

    def __init__(self, module: nn.Module, bucket_size_mb: float = 25.0):
        super().__init__()
        from torch.nn.parallel import DistributedDataParallel

        # broadcast_buffers=False: the reference LM's buffers (RoPE tables) are constants, and
        # re-broadcasting them every forward would add bytes no gradient needs. torch 2.13
        # deprecates the flag for forward_sync_buffers, which still syncs at init; its own
        # warning says to keep this flag until then: silenced, not a user's concern
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*broadcast_buffers", category=FutureWarning)
            self.ddp = DistributedDataParallel(module, bucket_cap_mb=bucket_size_mb,
                                               broadcast_buffers=False)
        self.module = module

    def forward(self, *args: object, **kwargs: object) -> object:
        return self.ddp(*args, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        """Nothing: DDP's reducer has waited for its all-reduces at the end of backward."""

    def close(self) -> None:
        """Nothing in flight after backward."""


class FSDP2(nn.Module):
    """torch's fully_shard (FSDP2) with the DDP wrappers' interface: parameters in
    `compute_dtype` for compute, gradients reduced in fp32; `reshard=False` keeps a micro-batch's
    gathered parameters from forward to backward (ZeRO-2's one gather, SHARD_GRAD_OP)."""

    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None,
                 reshard: bool = True):
        super().__init__()
        api = fsdp2_api()
        if api is None:
            raise RuntimeError("this torch has no fully_shard (FSDP2 needs torch >= 2.4)")
        fully_shard, policy_cls = api
        broadcast_from_rank0(module)  # fully_shard shards each rank's local values
        policy = (policy_cls(param_dtype=compute_dtype, reduce_dtype=torch.float32)
                  if compute_dtype is not None else policy_cls())
        keep = {} if reshard else {"reshard_after_forward": False}  # else torch's default
        for sub in module.modules():
            if isinstance(sub, nn.ModuleList):
                for block in sub:
                    fully_shard(block, mp_policy=policy, **keep)
        fully_shard(module, mp_policy=policy, **keep)
        self.module = module

    def forward(self, *args: object, **kwargs: object) -> object:
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        """Nothing: fully_shard reduce-scatters during backward and finalises at its end."""

    @torch.no_grad()
    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """{name: full tensor} (a collective: every rank must call it)."""
        return {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
                for name, p in self.module.named_parameters()}

    def close(self) -> None:
        """Nothing in flight after backward."""


def TorchZeRO1(params: Iterable, optimizer_cls: type[torch.optim.Optimizer],  # noqa: N802
               **kwargs: Any) -> torch.optim.Optimizer:
    """torch's ZeroRedundancyOptimizer with the ShardedOptimizer's call signature."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(params, optimizer_class=optimizer_cls, **kwargs)
