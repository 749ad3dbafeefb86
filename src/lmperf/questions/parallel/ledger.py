"""Every collective a rank issues in a step, with its process group: a dispatch mode.

The profiler's `gloo:` events (accounting.py) give each collective's time and the tensor gloo
was handed, but neither the process group nor, for an all-gather, the whole message: on a 2-D
mesh (FSDP x TP, HSDP, FSDP x PP) a tensor-parallel all-gather and a data-parallel one look
alike. The op itself knows: c10d's ops (FSDP2, DDP, pipelining's send / recv) carry the
ProcessGroup, the functional ones (DTensor: TP, sequence and loss parallelism) its name. The
ledger reads them as torch's CommDebugMode does and records per (collective, mesh dimension):
calls, S (the whole array, as nccl-tests defines it: an all-gather's output, a reduce-scatter's
input) and the bus bytes a ring moves through each rank (S x the busbw factor at the group's
size). Waits and autograd wrappers are not collectives and are skipped.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass_type
from torch.utils._pytree import tree_leaves

from lmperf.estimate.formulas import bus_factor

# op name (without overload) -> (collective, which tensor argument is S: 0 the first, 1 the second)
OPS: dict[str, tuple[str, int]] = {
    "all_reduce": ("all_reduce", 0), "all_reduce_coalesced": ("all_reduce", 0),
    "allreduce_": ("all_reduce", 0), "allreduce_coalesced_": ("all_reduce", 0),
    "all_gather_into_tensor": ("all_gather", -1),
    "all_gather_into_tensor_coalesced": ("all_gather", -1),
    "_allgather_base_": ("all_gather", 0), "allgather_": ("all_gather", 0),
    "allgather_into_tensor_coalesced_": ("all_gather", 0),
    "reduce_scatter_tensor": ("reduce_scatter", 0),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", 0),
    "_reduce_scatter_base_": ("reduce_scatter", 1), "reduce_scatter_": ("reduce_scatter", 1),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1),
    "broadcast": ("broadcast", 0), "broadcast_": ("broadcast", 0),
    "all_to_all_single": ("all_to_all", 0), "alltoall_base_": ("all_to_all", 1),
    "send": ("send", 0), "recv_": ("recv", 0),
}
NAMESPACES = ("c10d", "_c10d_functional")


def _group(args: tuple, kwargs: dict):
    """The ProcessGroup an op runs on: a boxed ProcessGroup (c10d ops) or a group name (the
    functional ops' last string argument), else None."""
    from torch.distributed import ProcessGroup
    from torch.distributed.distributed_c10d import _resolve_process_group

    leaves = tree_leaves((args, kwargs))
    for leaf in leaves:
        if isinstance(leaf, torch.ScriptObject):
            try:
                return ProcessGroup.unbox(leaf)
            except RuntimeError:  # a ReduceOp or another boxed object
                continue
    names = [leaf for leaf in leaves if isinstance(leaf, str)]
    for name in reversed(names):  # (..., reduce_op, group_name)
        try:
            return _resolve_process_group(name)
        except (ValueError, RuntimeError, KeyError):
            continue
    return None


def _bytes(value: object) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(value)
               if isinstance(t, torch.Tensor))


class Ledger(TorchDispatchMode):
    """Collectives issued while active: `rows` {(collective, dimension): {'calls', 'bytes',
    'bus_bytes', 'group_size'}} (bytes per rank, S as nccl-tests defines it). `names` maps a
    process group's name to its mesh dimension ('tp', 'dp_shard', ...); others are named by
    their size ('world' for all ranks)."""

    def __init__(self, names: dict[str, str] | None = None):
        super().__init__()
        self.names = names or {}
        self.rows: dict[tuple[str, str], dict] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(is_traceable_wrapper_subclass_type(t) for t in types):
            # DTensor first: the collectives it runs inside its ops (a Partial made whole, loss
            # parallelism's reductions) come back through the mode (CommDebugMode's way)
            return NotImplemented
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        op = func._schema.name.split("::")[-1] if func.namespace in NAMESPACES else None
        if op in OPS:
            self._record(*OPS[op], args, kwargs, out)
        return out

    def _record(self, collective: str, which: int, args: tuple, kwargs: dict, out: object) -> None:
        import torch.distributed as dist

        group = _group(args, kwargs)
        size = group.size() if group is not None else 1
        # S: the named tensor argument, or (functional all-gather) the output: g x the input
        s = _bytes(out if which < 0 else args[which])
        name = group.group_name if group is not None else ""
        dim = self.names.get(name) or (
            "world" if size == dist.get_world_size() else f"group of {size}")
        row = self.rows.setdefault((collective, dim), {"calls": 0, "bytes": 0, "bus_bytes": 0.0,
                                                       "group_size": size})
        row["calls"] += 1
        row["bytes"] += s
        p2p = collective in ("send", "recv")
        row["bus_bytes"] += s * (1.0 if p2p else bus_factor(collective, size) if size > 1 else 0.0)

    def table(self) -> list[dict]:
        """One row per (collective, dimension), sorted: what the record keeps."""
        return [{"collective": c, "dim": d, **v} for (c, d), v in sorted(self.rows.items())]
