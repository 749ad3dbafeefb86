"""Phantom tensors: a step runs its real code on tensors that allocate nothing, and every storage
it creates and frees is logged (docs/commands/plan.md, "The simulated step")."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

META = torch.device("meta")
CUDA_BLOCK = 512  # the CUDA caching allocator rounds every block up to a multiple of 512 B
_TO_COPY = torch.ops.aten._to_copy.default
_ITEM = torch.ops.aten._local_scalar_dense.default


class PhantomError(RuntimeError):
    """A tensor operation the simulation cannot run (a real tensor, or a phantom used outside)."""


class Phantom(torch.Tensor):
    """A tensor of `device` whose data is a meta tensor (`elem`): it has no bytes."""

    __slots__ = ["elem"]

    @staticmethod
    def __new__(cls, elem: torch.Tensor, device: torch.device) -> "Phantom":
        r = torch.Tensor._make_wrapper_subclass(
            cls, elem.size(), strides=elem.stride(), storage_offset=elem.storage_offset(),
            dtype=elem.dtype, layout=elem.layout, device=device,
            requires_grad=elem.requires_grad)
        r.elem = elem.detach() if elem.requires_grad else elem
        return r

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[override]
        raise PhantomError(f"a simulated tensor was used outside the simulation ({func})")

    def __repr__(self) -> str:  # type: ignore[override]
        return f"Phantom(shape={tuple(self.shape)}, dtype={self.dtype}, device={self.device})"


@dataclass
class StorageInfo:
    """One storage seen by the simulation: its size, when and where it was created and freed."""

    nbytes: int
    created: int  # index of its allocation event
    phase: str  # phase of the step when it was created
    cast_of_param: bool = False  # made by `_to_copy` from a parameter (autocast's weight casts)
    recomputed: bool = False  # made by a module's forward while backward runs (checkpointing)
    freed: int | None = None  # index of its free event (None: alive at the end)


@dataclass
class EventLog:
    """Allocation (+bytes) and free (-bytes) events, in order, each naming its storage id."""

    sid: list[int] = field(default_factory=list)
    delta: list[int] = field(default_factory=list)
    phase_starts: dict[str, int] = field(default_factory=dict)  # phase -> first event index


def _unwrap(x: Any, outer: dict[int, Phantom]) -> Any:
    """A Phantom -> its meta tensor (remembering the outer object), a device -> meta."""
    if isinstance(x, Phantom):
        outer[id(x.elem)] = x
        return x.elem
    if isinstance(x, torch.Tensor):
        if x.device.type == "meta":
            return x
        if (x.dim() == 0 or x.numel() == 0) and x.device.type == "cpu":
            return x.to(META)  # a Python-scalar-like constant, or an empty tensor: no bytes
        raise PhantomError(f"a real {tuple(x.shape)} tensor reached the simulation ({x.device}); "
                           "the model must create its tensors inside the simulated step")
    if isinstance(x, torch.device):
        return META
    return x


class PhantomMode(TorchDispatchMode):
    """Runs aten ops on meta tensors, returns Phantoms of `device`, logs storage lifetimes.

    `bytes_of(nbytes)` is what a storage costs (CUDA: rounded to 512 B blocks). The step tells
    the mode its phase through `set_phase`; `module_depth` > 0 means a module's forward is
    running (set by the simulator's global module hooks: during backward, that is recompute).
    """

    def __init__(self, device: torch.device, round_blocks: bool = False):
        super().__init__()
        self.device = device
        self.round_blocks = round_blocks
        self.storages: dict[int, StorageInfo] = {}
        self.log = EventLog()
        self.phase = "setup"
        self.module_depth = 0
        self.param_storages: set[int] = set()
        self._ids: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._refs: dict[int, weakref.ref] = {}
        self.ops = 0

    def bytes_of(self, nbytes: int) -> int:
        """Bytes a storage of `nbytes` costs on the simulated device."""
        if self.round_blocks and nbytes:
            return -(-nbytes // CUDA_BLOCK) * CUDA_BLOCK
        return nbytes

    def set_phase(self, phase: str) -> None:
        """Name the phase the next events belong to."""
        self.phase = phase
        self.log.phase_starts.setdefault(phase, len(self.log.sid))

    def storage_id(self, t: torch.Tensor) -> int:
        """The id of a phantom's (or meta tensor's) storage, logging it if it is new."""
        inner = t.elem if isinstance(t, Phantom) else t
        return self._track(inner)

    def _track(self, inner: torch.Tensor, cast_of_param: bool = False) -> int:
        st = inner.untyped_storage()
        sid = self._ids.get(st)
        if sid is not None:
            return sid
        sid = len(self.storages)
        self._ids[st] = sid
        nbytes = self.bytes_of(st.nbytes())
        self.storages[sid] = StorageInfo(
            nbytes, len(self.log.sid), self.phase, cast_of_param,
            recomputed=self.phase == "backward" and self.module_depth > 0)
        self.log.sid.append(sid)
        self.log.delta.append(nbytes)
        # The callback runs when the last tensor on this storage dies (CPython refcounting:
        # immediately, in step order), which is when the caching allocator would free it.
        self._refs[sid] = weakref.ref(st, lambda _, sid=sid: self._free(sid))
        return sid

    def _free(self, sid: int) -> None:
        info = self.storages[sid]
        info.freed = len(self.log.sid)
        self.log.sid.append(sid)
        self.log.delta.append(-info.nbytes)
        self._refs.pop(sid, None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        self.ops += 1
        outer: dict[int, Phantom] = {}
        a, k = tree_map(lambda x: _unwrap(x, outer), (args, kwargs or {}))
        if func is _ITEM:
            # A value the step reads (AdamW's step count, a scaler's found_inf): values do not
            # change allocations here, so any number works; 1 keeps bias corrections finite.
            return 1.0 if a[0].dtype.is_floating_point else 1
        if _takes_device(func):  # factories create on the meta device, whatever was asked
            k["device"] = META
        out = _run(func, a, k)
        cast = func is _TO_COPY and isinstance(args[0], Phantom) \
            and self._ids.get(args[0].elem.untyped_storage()) in self.param_storages
        return tree_map(lambda t: self._wrap(t, outer, cast), out)

    def _wrap(self, out: Any, outer: dict[int, Phantom], cast: bool) -> Any:
        if not isinstance(out, torch.Tensor):
            return out
        if id(out) in outer:  # an in-place op returns its input: the same outer tensor
            return outer[id(out)]
        self._track(out, cast)
        return Phantom(out, self.device)


# Output metadata of ops that return fresh tensors, by (op, input metadata): the meta kernels of
# many pointwise ops are Python (torch._refs) and cost ~1 ms each, while a model repeats the same
# shapes in every block (and every simulation of a sweep repeats them all). Ops whose outputs
# alias an input (views, in-place, out=) always run, so storage sharing stays exact.
_CACHE: dict[tuple, Any] = {}
_CACHE_LIMIT = 200_000
_FRESH: dict[Any, bool] = {}


def _fresh(func: Any) -> bool:
    known = _FRESH.get(func)
    if known is None:
        schema = func._schema
        known = _FRESH[func] = not schema.is_mutable and all(
            r.alias_info is None for r in schema.returns) and func is not _ITEM
    return known


def _meta_key(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return (tuple(x.shape), x.stride(), x.dtype, x.storage_offset())
    if isinstance(x, (list, tuple)):
        return tuple(_meta_key(v) for v in x)
    return x


def _describe(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        if out.storage_offset() or out.untyped_storage().nbytes() != torch.empty_strided(
                out.shape, out.stride(), dtype=out.dtype, device=META).untyped_storage().nbytes():
            raise _Uncacheable
        return ("t", tuple(out.shape), out.stride(), out.dtype)
    if isinstance(out, (list, tuple)):
        return (type(out), [_describe(v) for v in out])
    return ("v", out)


def _tensors(x: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(x) if isinstance(t, torch.Tensor)]


def _rebuild(d: Any) -> Any:
    if d[0] == "t":
        return torch.empty_strided(d[1], d[2], dtype=d[3], device=META)
    if d[0] == "v":
        return d[1]
    return d[0](_rebuild(v) for v in d[1])


class _Uncacheable(Exception):
    pass


def _run(func: Any, args: tuple, kwargs: dict) -> Any:
    """func(*args, **kwargs) on meta tensors, from the cache when the op returns fresh tensors."""
    if not _fresh(func):
        return func(*args, **kwargs)
    try:
        key = (func, _meta_key(args), tuple(sorted((k, _meta_key(v)) for k, v in kwargs.items())))
        hit = _CACHE.get(key)
    except (TypeError, NotImplementedError, RuntimeError):  # an argument without hash or ==
        return func(*args, **kwargs)
    if hit is not None:
        return _rebuild(hit)
    out = func(*args, **kwargs)
    # Some ops alias an input without saying so in their schema (`_unsafe_view`): never cache
    # an op whose output shares an input's storage.
    inputs = {id(t.untyped_storage()) for t in _tensors((args, kwargs))}
    if any(id(t.untyped_storage()) in inputs for t in _tensors(out)):
        _FRESH[func] = False
        return out
    try:
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.clear()
        _CACHE[key] = _describe(out)
    except _Uncacheable:
        pass
    return out


@cache
def _takes_device(func: Any) -> bool:
    """Whether an aten op has a `device` keyword (factories, `_to_copy`); cached per op."""
    return any(a.name == "device" for a in func._schema.arguments)
