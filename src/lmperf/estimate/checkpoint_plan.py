"""Checkpointing schedules for the simulator: uniform groups, the sqrt(N) rule, recursive
bisection (docs/commands/plan.md, "The simulated step")."""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch
from torch.utils.checkpoint import checkpoint

from lmperf.errors import SpecError

SCHEDULES: tuple[str, ...] = ("uniform", "bisection")


def sqrt_rule(num_blocks: int) -> int:
    """The sqrt(N) rule's group size: the integer nearest sqrt(N), at least 1."""
    return max(1, round(math.sqrt(num_blocks)))


def bisection_depth(num_blocks: int) -> int:
    """Checkpointed spans nested at most: ceil(log2 N) (0 for one block)."""
    return math.ceil(math.log2(num_blocks)) if num_blocks > 1 else 0


@contextlib.contextmanager
def bisection(model: torch.nn.Module) -> Iterator[None]:
    """While active, the reference LM checkpoints its blocks by recursive bisection.

    Without checkpointing the model runs its blocks as `_run_blocks(x, 0, N)`; replacing that
    method on the instance makes the loop a recursion of checkpointed halves (x (B, T, C) in,
    (B, T, C) out). Raises SpecError for a model without it.
    """
    run = getattr(model, "_run_blocks", None)
    layers = getattr(model, "layers", None)
    if run is None or layers is None or not hasattr(model, "set_checkpointing"):
        raise SpecError(f"{type(model).__name__} has no block loop to checkpoint by bisection "
                        "(the reference LM has)")
    before = model.checkpoint

    def recurse(x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        if stop - start <= 1:
            return layers[start](x) if stop > start else x
        mid = (start + stop) // 2
        # Only the first half's input is kept; the second half recurses on, so at most
        # ceil(log2 N) span inputs are alive together.
        x = checkpoint(recurse, x, start, mid, use_reentrant=False)
        return recurse(x, mid, stop)

    model.set_checkpointing("none")
    model._run_blocks = recurse  # instance attribute: shadows the method for this model only
    try:
        yield
    finally:
        del model._run_blocks
        model.set_checkpointing(before)
