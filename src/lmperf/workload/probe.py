"""The per-phase peak-memory probe: one for every command that reports memory per phase.

An observer of the step functions (`start()`, `lap(phase)`): at each boundary it synchronises,
reads the peak of the phase that ended, and starts a new window. It also records what is held at
the start and at the end of each phase. On the CPU, memory that the C allocator holds but no
tensor uses is handed back to the OS at each boundary first (glibc's malloc_trim), without which
the process's resident set keeps every freed activation and a later, smaller peak would read as
the earlier, larger one.
"""

from __future__ import annotations

import ctypes
import gc

from lmperf.runtime import device as dev


def _load_libc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018 - absent on musl and macOS
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _load_libc()


def release_freed_memory(collect: bool = False) -> None:
    """Hand memory the C allocator holds but no tensor uses back to the OS (glibc's malloc_trim).

    A no-op off glibc. `collect` first runs Python's cycle collector (~0.1 s: not at every phase
    boundary; tensors are freed by reference counting as soon as a step drops them).
    """
    if collect:
        gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


class PhaseProbe:
    """Peak memory per phase (MiB), plus what is held at the start and at each phase's end.

    `phases`: phase -> peak figures ({'rss'} on the CPU, {'allocated', 'reserved'} on CUDA);
    `start_mib`: figures when the step started; `held`: phase -> figures when it ended.
    Right after a reset the peak equals the current figure, so `reset(); read()` is "now".
    """

    def __init__(self, memory: dev.PeakMemory):
        self.memory = memory
        self.phases: dict[str, dict] = {}
        self.start_mib: dict = {}
        self.held: dict[str, dict] = {}

    def _settle(self) -> None:
        dev.synchronize(self.memory.device)
        if not self.memory.cuda:
            release_freed_memory()

    def start(self) -> None:
        self._settle()
        self.memory.reset()
        self.start_mib, self.phases, self.held = self.memory.read(), {}, {}

    def lap(self, phase: str) -> None:
        dev.synchronize(self.memory.device)
        peak = self.memory.read()  # the peak of the phase that ended; a phase that repeats
        before = self.phases.get(phase, {})  # within a step (a micro-batch each) keeps its max
        self.phases[phase] = {k: max(v, before[k]) if before.get(k) is not None and v is not None
                              else v for k, v in peak.items()}
        self._settle()
        self.memory.reset()
        self.held[phase] = now = self.memory.read()
        # the peak read above can trail "now" by the few KiB the interpreter allocates between
        # the two reads (a CPU's RSS): a phase's peak is at least what it holds at its end
        self.phases[phase] = {k: max(v, now[k]) if v is not None and now.get(k) is not None
                              else v for k, v in self.phases[phase].items()}

    def result(self) -> dict:
        """{'kind', 'unit': 'MiB', 'phases': phase -> peak figures} (a record's memory field)."""
        return {"kind": self.memory.kind, "unit": "MiB", "phases": self.phases}
