"""Which outputs of a CPU training step pay page faults, and which frees give memory back to the
kernel: the step's allocations and frees replayed through a model of glibc malloc's main heap
(the CPU prediction charges both at measured rates, `runtime.calibration.fresh_memory_cost`).

A CPU tensor's storage comes from `posix_memalign` (c10's CPU allocator), that is glibc's malloc.
A block the kernel maps in is faulted in page by page when the op first writes it (a page fault
plus zeroing, ~0.6 ns per byte on the project's VM), so a step pays for every byte the heap has
to take back from the kernel, at every step. What glibc does, from mallopt(3) (M_MMAP_THRESHOLD,
M_TRIM_THRESHOLD) and malloc/malloc.c (sysmalloc, systrim, free's dynamic threshold):
- A request of at least the mmap threshold T that the heap cannot serve from a free block or
  its free top (glibc looks there first: sysmalloc, which maps, runs only when they fail) is
  mapped on its own (mmap) and unmapped when freed: it faults in at every call. T starts at
  128 KiB; freeing a mapped block of up to 32 MiB (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit) raises
  T to its size and the trim threshold to 2 T. After a step's warm-up, T is the largest block
  the step freed, up to 32 MiB: same-sized requests then come from the heap; larger ones, and
  those of 32 MiB or more, are mapped at every call unless a free block holds them.
- Smaller requests come from the heap; when no free space fits, the heap grows (sbrk) and the
  new pages fault in as they are written.
- When a free leaves more than the trim threshold (2 T) free at the top of the heap, glibc gives
  it back to the kernel (systrim): the next step that grows the heap faults those pages again.

The model keeps the heap's blocks in address order: a request takes the smallest free block
that fits (glibc's large bins are best-fit), else the free top, else the heap grows and the new
bytes fault in; a free coalesces with its free neighbours and, when that leaves a free top of at
least 2 T, trims it. So a long-lived block above a hole keeps the hole resident (AdamW's moments,
created in the first step above that step's activations, do so on this machine), which a count
of live bytes alone would miss. The events replayed are the first (uncounted) step's, then the
counted step's `REPLAYS` times; the last replay is counted: the steady state of `--warmup`
steps. What it cannot see: Python objects and kernels' scratch memory (not tensors), glibc's
small-chunk caches (tcache, fastbins: no coalescing), the process's allocations before the step
(a bench job's fork server). Measured against the faults a real step takes
(`resource.getrusage(...).ru_minflt`): docs/benchmarks.md, issue 20 runs 8+.

The model is glibc's: where the process's C library is another (musl's mallocng maps every
large block and has no dynamic threshold; macOS's and Windows' allocators differ again),
`glibc_version()` is None and `workload.op_costs` leaves page faults out and says so.
"""

from __future__ import annotations

import os
import platform
from collections import defaultdict
from dataclasses import dataclass
from typing import Hashable, Sequence

PAGE = 4096
MMAP_THRESHOLD_MIN = 128 * 2**10  # glibc's DEFAULT_MMAP_THRESHOLD (mallopt(3))
MMAP_THRESHOLD_MAX = 32 * 2**20  # DEFAULT_MMAP_THRESHOLD_MAX on 64-bit systems
REPLAYS = 3
# One event: (storage id, bytes >= 0, key) for an allocation by the op `key`; (storage id, -1,
# phase) for the free of that storage during `phase`.
Event = tuple[int, int, Hashable]


def glibc_version() -> str | None:
    """The version of glibc this process runs on ('2.36'), or None where the C library is
    another (musl, macOS, Windows): the heap model below is glibc's only."""
    try:  # the running library's own answer (Linux with glibc)
        name, _, version = os.confstr("CS_GNU_LIBC_VERSION").partition(" ")
        return version if name == "glibc" and version else None
    except (AttributeError, ValueError, OSError):  # no confstr, or not a name the libc knows
        lib, version = platform.libc_ver()
        return version if lib == "glibc" and version else None


def _chunk(nbytes: int) -> int:
    """The heap chunk glibc carves for a request of `nbytes`: its header, 16-byte aligned."""
    return -(-(nbytes + 8) // 16) * 16


def _pages(nbytes: int) -> int:
    """The mapped block of a request of `nbytes`: chunk and header rounded up to pages."""
    return -(-(_chunk(nbytes) + 8) // PAGE) * PAGE


def mmap_threshold(events: Sequence[Event]) -> int:
    """glibc's dynamic mmap threshold after the step has run once: the largest block it frees
    (as mapped: page-rounded with its header), clamped to [128 KiB, 32 MiB]. A request of the
    same size then stays below it and comes from the heap."""
    sizes = {sid: n for sid, n, key in events if n >= 0}
    freed = [_pages(sizes[sid]) for sid, n, key in events if n < 0 and sid in sizes]
    return min(MMAP_THRESHOLD_MAX, max([MMAP_THRESHOLD_MIN, *freed]))


class _Heap:
    """glibc's main heap in address order: blocks [address, bytes, storage id or None if
    free]; `extent` is its end (everything below it is resident)."""

    def __init__(self, trim: int):
        self.blocks: list[list] = []
        self.extent = 0
        self.trim = trim

    def fits(self, nbytes: int) -> bool:
        """Whether a free block or the free top holds `nbytes` (the heap need not grow)."""
        return any(b[2] is None and b[1] >= nbytes for b in self.blocks)

    def allocate(self, sid: int, nbytes: int) -> int:
        """Place storage `sid`; returns the bytes the heap had to grow (they fault in)."""
        fits = [b for b in self.blocks[:-1] if b[2] is None and b[1] >= nbytes]
        if fits:  # best fit among the free blocks below the top; the rest stays free
            i = self.blocks.index(min(fits, key=lambda b: (b[1], b[0])))
            block = self.blocks[i]
            if block[1] > nbytes:
                self.blocks.insert(i + 1, [block[0] + nbytes, block[1] - nbytes, None])
            block[1], block[2] = nbytes, sid
            return 0
        top = self.blocks[-1] if self.blocks and self.blocks[-1][2] is None else None
        if top is not None and top[1] >= nbytes:  # carved from the free top
            if top[1] > nbytes:
                self.blocks.append([top[0] + nbytes, top[1] - nbytes, None])
            top[1], top[2] = nbytes, sid
            return 0
        start = top[0] if top is not None else self.extent
        grow = start + nbytes - self.extent  # the free top, if any, is used first
        if top is not None:
            self.blocks.pop()
        self.blocks.append([start, nbytes, sid])
        self.extent += grow
        return grow

    def free(self, sid: int) -> int:
        """Free storage `sid`: coalesce with free neighbours; trim a free top of >= `trim`.
        Returns the bytes trimmed (given back to the kernel)."""
        i = next(i for i, b in enumerate(self.blocks) if b[2] == sid)
        self.blocks[i][2] = None
        if i + 1 < len(self.blocks) and self.blocks[i + 1][2] is None:
            self.blocks[i][1] += self.blocks.pop(i + 1)[1]
        if i > 0 and self.blocks[i - 1][2] is None:
            self.blocks[i - 1][1] += self.blocks.pop(i)[1]
            i -= 1
        if i == len(self.blocks) - 1 and self.blocks[i][1] >= self.trim:
            start, size, _ = self.blocks.pop()  # systrim: the top goes back to the kernel
            self.extent = start
            return size
        return 0


@dataclass(frozen=True)
class Faults:
    """What a step's storages cost the kernel per step, in the steady state.

    faulted: op key -> bytes its allocations fault in (fresh pages, written by the op).
    returned: phase -> bytes the frees in that phase give back to the kernel (a heap top
        trimmed, a mapped block unmapped), which the next allocations fault in again.
    """

    faulted: dict[Hashable, int]
    returned: dict[Hashable, int]


def replay(events: Sequence[Event], first: Sequence[Event] = (),
           replays: int = REPLAYS) -> Faults:
    """Replay the storage events of a step (`events`, in order) after a first step's (`first`)
    through the heap model (see the module), `replays` times, and count the last replay.
    Storages still alive at the end of the events are freed there, in no phase (the step's
    outputs, dropped before the next step); the first step's survivors live on (AdamW's
    moments)."""
    threshold = mmap_threshold(list(first) + list(events))
    heap = _Heap(2 * threshold)
    sizes = {sid: n for sid, n, key in list(first) + list(events) if n >= 0}
    freed = {sid for sid, n, key in events if n < 0}
    tail = [(sid, -1, None) for sid, n, key in events if n >= 0 and sid not in freed]
    mapped: set[int] = set()
    placed: set[int] = set()
    faulted: dict[Hashable, int] = defaultdict(int)
    returned: dict[Hashable, int] = defaultdict(int)
    passes = [(list(first), False)] + [(list(events) + tail, i == replays - 1)
                                      for i in range(replays)]
    for sequence, counted in passes:
        for sid, nbytes, key in sequence:
            back = 0
            if nbytes >= 0:  # an allocation by op `key`
                chunk = _chunk(nbytes)
                if chunk >= threshold and not heap.fits(chunk):  # mapped: faults each call
                    mapped.add(sid)
                    grow = nbytes  # the pages the op writes
                else:
                    placed.add(sid)
                    grow = heap.allocate(sid, chunk)
                if counted and grow:
                    faulted[key] += grow
            elif sid in mapped:  # a free in phase `key`: munmap
                mapped.discard(sid)
                back = sizes[sid]
            elif sid in placed:
                placed.discard(sid)
                back = heap.free(sid)
            if counted and back and key is not None:
                returned[key] += back
    return Faults(dict(faulted), dict(returned))
