"""Pre-flight: a run that clearly cannot fit in the memory it may use is an 'oom' row in seconds.

Runs in the job (the child), before the model is built: a 10B model on a 23 GiB machine used to
allocate for minutes before failing. The bound is closed-form and a lower bound: the model built
on the meta device (shapes only, ~0.1 s in a warm child; any factory) gives the parameters N
(N_t of them trainable), p bytes each in the regime's parameter dtype. The parameters live
throughout; AdamW's 2 N_t x p of state from the first step on (train-step); the logits, B x T x
V in the matmul dtype, until the loss's backward; the N_t x p of gradients from then to the
step's end. So a step needs at least N p + the larger of (state + logits) and (state +
gradients). Everything else it holds (saved activations, temporaries) comes on top, so a bound
above the memory available means the run cannot fit. It is held
against the smallest of what this process may still take: the device's free memory (the CPU:
MemAvailable of /proc/meminfo; CUDA: the driver's free memory), the cgroup's limit less its
usage, and the launcher's cap (--max-memory-gib: RLIMIT_AS less the address space already
mapped; the CUDA allocator's fraction). MARGIN states how far over counts as clearly: free
memory moves as neighbours allocate. Near the limit the run goes ahead and the cap (or the
device) decides; `lmperf memory --estimate` simulates the step when the answer matters.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from lmperf.model.custom import build_model
from lmperf.runtime.precision import Regime
from lmperf.workload.spec import RunSpec

GIB = 2**30
# A run is refused when its lower bound exceeds the memory available by more than this fraction.
MARGIN = 0.05
# Set (to 1) in a job's environment by the launcher for `--force`: run whatever the bound says.
FORCE_ENV = "LMPERF_FORCE"


class PredictedOutOfMemory(MemoryError):
    """A run refused before it started: its lower bound does not fit (an 'oom' row)."""


@dataclass(frozen=True)
class Bound:
    """A lower bound on a step's memory, in bytes, and what it counts (for the message)."""

    bytes: int
    counts: str


def lower_bound(spec: RunSpec, regime: Regime) -> Bound:
    """The closed-form lower bound of one step of `spec` under `regime` (module docstring)."""
    with torch.device("meta"):  # shapes only: nothing allocated, any factory
        model = build_model(spec.model_config(), spec.model)
    p = regime.param_dtype.itemsize
    n = sum(t.numel() for t in model.parameters()) * p
    trained = sum(t.numel() for t in model.parameters() if t.requires_grad) * p
    a = regime.autocast_dtype.itemsize if regime.autocast_dtype is not None else p
    logits = spec.batch * spec.context * spec.vocab_size * a
    state = 2 * trained if spec.mode == "train-step" else 0
    grads = trained if spec.mode != "forward" else 0
    dtype = str(regime.param_dtype).replace("torch.", "")
    what = {"forward": f"parameters ({dtype}) and the logits",
            "forward-backward": f"parameters ({dtype}) and the larger of the logits and the "
                                "gradients",
            "train-step": f"parameters and AdamW state ({dtype}) and the larger of the logits "
                          "and the gradients"}[spec.mode]
    return Bound(n + state + max(logits, grads), what)


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


def check_fits(spec: RunSpec, device: torch.device, regime: Regime, fields: dict) -> None:
    """Raise PredictedOutOfMemory (a MemoryError: the envelope writes an 'oom' row) when the
    lower bound of `spec` exceeds the memory available by more than MARGIN, unless the job's
    environment says --force; the figures go into `fields['predicted']` (the record's) first."""
    if os.environ.get(FORCE_ENV) == "1":
        return
    room = available(device)
    if room is None:
        return
    bound = lower_bound(spec, regime)
    free, what = room
    if bound.bytes > free * (1 + MARGIN):
        fields["predicted"] = {"status": "oom", "needs_bytes": bound.bytes, "counts": bound.counts,
                               "available_bytes": free, "limited_by": what, "margin": MARGIN}
        raise PredictedOutOfMemory(
            f"predicted, not run: needs >= {bound.bytes / GIB:.1f} GiB for {bound.counts}, "
            f"{free / GIB:.1f} GiB {what}, {(bound.bytes - free) / GIB:.1f} GiB over "
            "(--force runs it)")
