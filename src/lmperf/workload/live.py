"""THE peak of live tensor bytes over a stretch of code (a step), counted on the tensors.

`LiveBytes` is a dispatch mode: every storage held at the start (`held`) and every one an op
creates is counted once, from its creation until it is freed (a weak reference), as torch's
MemTracker counts them (its module hooks refuse a module called several times in one step,
which gradient accumulation and a pipeline's micro-batches do). A tensor subclass (DTensor,
FSDP2's sharded parameters) is counted by the plain tensors it wraps, so a rank counts its
shards, not the global shapes; its ops are left to it, so that the plain ops it runs (the
buffers of its redistributions included) come back through the mode and are counted too. Bytes
are the same on a CPU rank as on a GPU one: what the plan predicts per rank. Used by `dist
train`; `plan --confirm` has its own copy for now.
"""

from __future__ import annotations

import weakref
from typing import Iterable

import torch
from torch.utils._python_dispatch import (TorchDispatchMode, is_traceable_wrapper_subclass,
                                          is_traceable_wrapper_subclass_type)
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary


def plain_tensors(t: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors holding `t`'s data: `t` itself, or a wrapper subclass's inner tensors
    (recursively: a DTensor's local shard)."""
    if not is_traceable_wrapper_subclass(t):
        return [t]
    names, _ = t.__tensor_flatten__()
    inner = (getattr(t, name) for name in names)
    return [leaf for x in inner if isinstance(x, torch.Tensor) for leaf in plain_tensors(x)]


class LiveBytes(TorchDispatchMode):
    """`peak`: the most bytes live at once since entering, `held` included (see the module
    docstring); `live`: bytes live now. Enter it as a context manager around the step."""

    def __init__(self, held: Iterable[torch.Tensor]):
        super().__init__()
        self.seen: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.live = self.peak = 0
        for t in held:
            self._add(t)

    def _add(self, t: torch.Tensor) -> None:
        for leaf in plain_tensors(t):
            st = leaf.untyped_storage()
            if st in self.seen or st.device.type == "meta":
                continue
            self.seen[st] = n = st.nbytes()
            self.live += n
            self.peak = max(self.peak, self.live)
            weakref.finalize(st, self._free, n)

    def _free(self, n: int) -> None:
        self.live -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(is_traceable_wrapper_subclass_type(t) for t in types):
            return NotImplemented  # the subclass runs first: its plain ops come back here
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._add(t)
        return out
