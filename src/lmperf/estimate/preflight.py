"""Pre-flight: a run that clearly cannot fit in the memory it may use is an 'oom' row in seconds.

In the job, before the model is built: the one answer to "does it fit" (`estimate.fit
.device_fit`) against the least this process may still take (the device's free memory, the
cgroup's limit, --max-memory-gib); MARGIN is how far over counts as clearly. A model the
simulator cannot run goes ahead."""

from __future__ import annotations

import os
from dataclasses import replace

import torch

from lmperf.runtime.precision import Regime
from lmperf.units import GIB
from lmperf.workload.spec import RunSpec

# A run is refused when what it needs exceeds the memory available by more than this fraction.
MARGIN = 0.05
# Set (to 1) in a job's environment by the launcher for `--force`: run whatever the check says.
FORCE_ENV = "LMPERF_FORCE"


class PredictedOutOfMemory(MemoryError):
    """A run refused before it started: its simulated step does not fit (an 'oom' row)."""


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _cgroup_left() -> int | None:
    """The cgroup's memory limit less its working set (v2, else v1): usage less the inactive
    file cache the kernel reclaims first (as kubelet and `docker stats` count it); None
    without a limit."""
    for root, limit, usage, inactive in (
            ("/sys/fs/cgroup/", "memory.max", "memory.current", "inactive_file"),
            ("/sys/fs/cgroup/memory/", "memory.limit_in_bytes", "memory.usage_in_bytes",
             "total_inactive_file")):
        cap, used = _read_int(root + limit), _read_int(root + usage)
        if cap is not None and used is not None and cap < 2**60:  # v1 writes "no limit" as ~2**63
            cache = 0
            try:
                with open(root + "memory.stat") as f:
                    cache = next((int(ln.split()[1]) for ln in f
                                  if ln.split()[0] == inactive), 0)
            except (OSError, ValueError, IndexError):
                pass
            return max(0, cap - (used - min(cache, used)))
    return None


def available(device: torch.device) -> tuple[int, str] | None:
    """The bytes this process may still take on `device` and what limits them; None when
    nothing can be read (no /proc, an unknown device)."""
    from lmperf.runtime.device import capped_room

    limits = capped_room(device)  # the device's free memory and the launcher's cap
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as f:
                kib = next(int(ln.split()[1]) for ln in f if ln.startswith("MemAvailable:"))
            limits.append((kib * 1024, "available (MemAvailable)"))
        except (OSError, StopIteration, ValueError):
            pass
        if (left := _cgroup_left()) is not None:
            limits.append((left, "left under the cgroup's limit"))
    return min(limits) if limits else None


def check_fits(spec: RunSpec, device: torch.device, regime: Regime, fields: dict,
               checkpoint: int = 0) -> None:
    """Raise PredictedOutOfMemory (a MemoryError: the envelope writes an 'oom' row) when one
    simulated step of `spec` needs more than the memory available by more than MARGIN, unless
    the job's environment says --force; the figures go into `fields['predicted']` first."""
    from lmperf.estimate.fit import device_fit

    if os.environ.get(FORCE_ENV) == "1":
        return
    room = available(device)
    if room is None:
        return
    need = device_fit(replace(spec, device=device.type, precision=regime.name), None, checkpoint)
    free, what = room
    if need and need["peak_gib"] * GIB > free * (1 + MARGIN):
        needs = int(need["peak_gib"] * GIB)
        fields["predicted"] = {"status": "oom", "needs_bytes": needs, "counts": "simulated step",
                               "available_bytes": free, "limited_by": what, "margin": MARGIN}
        raise PredictedOutOfMemory(
            f"predicted, not run: one step needs {needs / GIB:.1f} GiB (simulated), "
            f"{free / GIB:.1f} GiB {what}, {(needs - free) / GIB:.1f} GiB over "
            "(--force runs it)")
