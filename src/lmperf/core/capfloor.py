"""The least CPU memory cap a job can start under, and the refusal of a cap below it.

On the CPU `--max-memory-gib` is the child's address-space limit (RLIMIT_AS), which counts every
mapping: torch's libraries, the allocator's arenas, thread stacks. A child forked from the warm
server maps ~0.94 GiB before its job runs on a CPU build of torch (2.13, measured), a CUDA build
~3 GiB; under such a cap every job died at its first import and each row said so. What a child
maps is measured once per interpreter, torch build and launch (warm or cold), by a job that runs
nothing through the launcher every job uses, and cached; a cap that leaves less than MARGIN
above it is refused before anything runs (one line, exit 2).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import ClassVar

from lmperf.errors import SpecError
from lmperf.results.schema import SpecDict
from lmperf.runtime.cache import read_cache, update_cache
from lmperf.units import GIB, MIB

MARGIN = 256 * MIB
"""What a job maps above the cap's floor (its runner's imports): runtime.device.cap_memory's."""
CACHE = "mapped.json"  # in $XDG_CACHE_HOME/lmperf


@dataclass(frozen=True)
class MappedSpec(SpecDict):
    """The probe: a job that runs nothing; its record gives what its process maps."""

    kind: ClassVar[str] = "probe"
    runner: ClassVar[str] = "lmperf.core.capfloor:mapped"

    device: str = "cpu"

    def label(self) -> str:
        """A short name for messages."""
        return "what a job maps before it runs"


def mapped(spec: MappedSpec) -> dict:
    """In the child: its address space now, in bytes (None without /proc)."""
    from lmperf.runtime.device import address_space_bytes

    return {"kind": MappedSpec.kind, "status": "ok", "spec": spec.to_dict(),
            "address_space": address_space_bytes()}


def floor_bytes(warm: bool) -> int | None:
    """What a CPU job's process maps before its job runs (bytes): cached for this interpreter,
    torch build and launch, else measured now (a child that runs nothing, launched as every job
    is: forked from the warm server with `warm`); None where it cannot be read."""
    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = "?"
    key = f"{sys.executable} | torch {torch_version} | {'warm' if warm else 'cold'}"
    cached = read_cache(CACHE).get(key)
    if isinstance(cached, int):
        return cached
    from lmperf.core.launch import ChildProcess, WarmChild

    records = (WarmChild if warm else ChildProcess)(MappedSpec(), timeout_s=120).run()
    found = records[0].get("address_space") if records else None
    if not isinstance(found, int):
        return None
    update_cache(CACHE, {key: found})
    return found


def check_cap(gib: float, warm: bool) -> None:
    """SpecError for a CPU `--max-memory-gib` no job can start under: one line with the figure
    this build needs."""
    need = floor_bytes(warm)
    if need is None or gib * GIB > need + MARGIN:
        return
    raise SpecError(f"--max-memory-gib {gib:g} caps a CPU job's address space (RLIMIT_AS), and a "
                    f"job of this build (torch {version('torch')}) maps {need / GIB:.2f} GiB "
                    f"before it runs: give more than {(need + MARGIN) / GIB:.2f} GiB")
