"""A readable ZeRO-1: optimizer state sharded across ranks, each rank updating its own params.

`ShardedOptimizer(params, optimizer_cls, **kwargs)` gives every parameter an owner rank
(greedily to the least-loaded rank, by element count, so the shards are balanced) and builds the
real optimizer (`optimizer_cls(**kwargs)`) over this rank's parameters only: its state (AdamW's
two moments, 8 bytes per fp32 parameter) exists on one rank instead of all. `step()` updates the
owned parameters, then every parameter is broadcast from its owner, so all ranks hold the same
weights again. Gradients must already be averaged (pair it with a data-parallel wrapper);
what that communicates: docs/commands/dist.md, "`--estimate`".
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist


class ShardedOptimizer(torch.optim.Optimizer):
    """Optimizer-state sharding around `optimizer_cls` (see the module docstring).

    `param_groups` holds every parameter (schedulers and zero_grad see them all); the local
    optimizer holds this rank's. `add_param_group` works after construction too.
    """

    def __init__(self, params: Iterable, optimizer_cls: type[torch.optim.Optimizer], **kwargs: Any):
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.optimizer_cls, self.kwargs = optimizer_cls, kwargs
        self.local: torch.optim.Optimizer | None = None
        self.local_groups: list[dict | None] = []  # outer group index -> its local group
        self.owner: dict[int, int] = {}  # id(param) -> rank that updates it
        self.loads = [0] * self.world_size  # elements owned per rank
        super().__init__(params, kwargs)  # calls add_param_group for each group

    def add_param_group(self, param_group: dict) -> None:
        """Add a group: every rank records it, and owns a balanced share of its parameters."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        mine = []
        for p in group["params"]:
            owner = min(range(self.world_size), key=lambda r: (self.loads[r], r))
            self.owner[id(p)] = owner
            self.loads[owner] += p.numel()
            if owner == self.rank:
                mine.append(p)
        if not mine:  # nothing of this group here: nothing to update, nothing to hold
            self.local_groups.append(None)
            return
        local = {**{k: v for k, v in group.items() if k != "params"}, "params": mine}
        if self.local is None:
            self.local = self.optimizer_cls([local], **self.kwargs)
        else:
            self.local.add_param_group(local)
        self.local_groups.append(self.local.param_groups[-1])

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None, **kwargs: Any) -> float | None:
        """Update this rank's parameters, then broadcast every parameter from its owner."""
        loss = None
        if self.local is not None:
            for group, local in zip(self.param_groups, self.local_groups):
                if local is not None:  # a scheduler may have changed the outer group's lr
                    local.update({k: v for k, v in group.items() if k != "params"})
            loss = self.local.step(closure, **kwargs)
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    dist.broadcast(p, src=self.owner[id(p)])
        return loss
