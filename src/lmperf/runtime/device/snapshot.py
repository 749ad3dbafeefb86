"""CUDA memory history, snapshots and the out-of-memory dump (no-ops on a CPU build)."""

from __future__ import annotations

import os
from pathlib import Path

import torch


SNAPSHOT_MAX_ENTRIES = 100_000
"""Alloc/free events kept by the history ring buffer (torchtitan's value; older ones are dropped)."""


def memory_history_unsupported_reason(device: torch.device) -> str | None:
    """Why allocator history and snapshots cannot be taken on `device`, or None when they can."""
    if device.type != "cuda":
        return (f"memory history and snapshots are CUDA only (the CUDA caching allocator records "
                f"them); this run is on the {device.type}")
    if not torch.cuda.is_available():
        return "memory history and snapshots are CUDA only, and torch sees no CUDA device here"
    return None


def start_memory_history(device: torch.device, max_entries: int = SNAPSHOT_MAX_ENTRIES,
                         context: str = "all", stacks: str = "python") -> bool:
    """Start recording every alloc/free of the CUDA allocator with its stack; False on the CPU.

    context="all" keeps the stack of frees too; stacks="python" keeps Python frames only
    ("all" adds C++ frames: bigger files and ~50 ns per frame more per event). Recording is
    process-wide (all CUDA devices), whatever `device` says.
    """
    if memory_history_unsupported_reason(device):
        return False
    torch.cuda.memory._record_memory_history(enabled="all", context=context, stacks=stacks,
                                             max_entries=max_entries)
    return True


def stop_memory_history(device: torch.device) -> bool:
    """Stop recording allocator history; False on the CPU. Stopping drops the recorded events
    (the allocator clears its ring buffer), so dump first."""
    if memory_history_unsupported_reason(device):
        return False
    torch.cuda.memory._record_memory_history(enabled=None)
    return True


def dump_memory_snapshot(device: torch.device, path: str | os.PathLike) -> bool:
    """Write the allocator's snapshot (segments + recorded history) as a pickle to `path`.

    The file opens in pytorch.org/memory_viz. Returns False (and writes nothing) on the CPU.
    """
    if memory_history_unsupported_reason(device):
        return False
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    torch.cuda.memory._dump_snapshot(str(path))
    return True


# torch has no way to detach an OOM observer, so one observer is attached per process and
# `on_oom_dump` only re-points it; a sweep arming it once per run does not stack observers.
_oom_dump: dict[str, object] = {"path": None, "attached": False, "dumps": 0}


def _dump_on_oom(device: int, alloc: int, device_allocated: int, device_free: int) -> None:
    path = _oom_dump["path"]
    if path is None:
        return
    try:
        dump_memory_snapshot(torch.device("cuda", device), str(path))
        _oom_dump["dumps"] = int(_oom_dump["dumps"]) + 1  # type: ignore[call-overload]
    except Exception:  # noqa: BLE001 - the OOM itself must surface, not a failed dump
        pass


def on_oom_dump(device: torch.device, path: str | os.PathLike) -> bool:
    """Dump a snapshot to `path` when the CUDA allocator runs out of memory (until
    `cancel_oom_dump`). The allocator may call it several times for one failing step (e.g. a
    retry with a smaller workspace): the last dump wins. False on the CPU or when this torch
    has no OOM observer hook."""
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if memory_history_unsupported_reason(device) or attach is None:
        return False
    _oom_dump["path"] = str(path)
    if not _oom_dump["attached"]:
        attach(_dump_on_oom)
        _oom_dump["attached"] = True
    return True


def cancel_oom_dump() -> None:
    """Stop dumping on OOM (the observer stays attached but does nothing)."""
    _oom_dump["path"] = None


def oom_dumps() -> int:
    """How many snapshots the OOM observer has written in this process."""
    return int(_oom_dump["dumps"])  # type: ignore[call-overload]
