"""THE peak of live tensor bytes over a stretch of code (a step), counted on the tensors.

`LiveBytes` is a dispatch mode: every storage held at the start (`held`) and every one an op
creates is counted from its creation until it is freed (a weak reference), as torch's MemTracker
counts them (its module hooks refuse a module called several times in one step, which gradient
accumulation and a pipeline's micro-batches do). A tensor subclass (DTensor, FSDP2's sharded
parameters) is counted by the plain tensors it wraps, so a rank counts its shards, not the
global shapes; its ops are left to it, so that the plain ops it runs (the buffers of its
redistributions included) come back through the mode and are counted too. A storage is counted
at its size NOW: FSDP2 frees a gathered parameter by resizing its storage to 0 bytes and gathers
it again by resizing it back (`_fsdp_param.free_storage` / `alloc_storage`, which call
`UntypedStorage.resize_` and dispatch nothing), so the mode follows those resizes (the method is
wrapped while the mode is entered) and the ones an op makes (`resize_`, `out=`); counted once at
its first size, the gathered weights of every block would stay counted after they were freed
(HSDP 2 x 2 on mini: 65.7 MiB instead of 53.0). Bytes are the same on a CPU rank as on a GPU
one: what the plan predicts per rank. Used by `dist train` and `plan --confirm`.
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
        self.seen: WeakIdKeyDictionary = WeakIdKeyDictionary()  # storage -> [bytes counted]
        self.live = self.peak = 0
        self._resize = None
        for t in held:
            self._add(t)

    def _add(self, t: torch.Tensor) -> None:
        for leaf in plain_tensors(t):
            st = leaf.untyped_storage()
            if st.device.type == "meta":
                continue
            if st not in self.seen:
                self.seen[st] = counted = [0]
                weakref.finalize(st, self._free, counted)
            self._count(st)

    def _count(self, st) -> None:
        """Count storage `st` (one already seen) at its size now."""
        counted = self.seen[st]
        n = st.nbytes()
        if n != counted[0]:
            self.live += n - counted[0]
            counted[0] = n
            self.peak = max(self.peak, self.live)

    def _free(self, counted: list[int]) -> None:
        self.live -= counted[0]

    def _resized(self, t: torch.Tensor) -> None:
        """Recount the storages of `t` already seen (an op's argument may have been resized)."""
        for leaf in plain_tensors(t):
            st = leaf.untyped_storage()
            if st in self.seen:
                self._count(st)

    def __enter__(self):
        original = torch.UntypedStorage.resize_
        self._resize = torch.UntypedStorage.__dict__.get("resize_")
        mode = self

        def resize_(storage, size):  # FSDP2's free and gather of its unsharded parameters
            out = original(storage, size)
            if storage in mode.seen:
                mode._count(storage)
            return out

        torch.UntypedStorage.resize_ = resize_
        return super().__enter__()

    def __exit__(self, *exc):
        if self._resize is None:
            del torch.UntypedStorage.resize_  # the method inherited from torch._C.StorageBase
        else:
            torch.UntypedStorage.resize_ = self._resize
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(is_traceable_wrapper_subclass_type(t) for t in types):
            return NotImplemented  # the subclass runs first: its plain ops come back here
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor):
                self._resized(t)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._add(t)
        return out
