"""The host's time to issue one op: given (`--host-us`), measured here when the target GPU is the
one at hand, else the sourced default. Every prediction records which, and where it came from."""

from __future__ import annotations

import time
from dataclasses import replace
from functools import lru_cache

HOST_OP_S = 5e-6
HOST_OP_SOURCE = (
    "default 5 us per aten op call (--host-us): the low end of the 5-25 us that Python, the "
    "dispatcher and a kernel launch usually cost per eager op, what a current server CPU "
    "attains; CS336's host-bound runs imply 17 us (A100, 2025) and at most 5 us (B200, "
    "2026), the 2026-11-27 H200 host 13-15 us under autocast: docs/accuracy.md")
GIVEN = "given (--host-us)"


def local_gpu(name: str) -> bool:
    """Whether the GPU of the peak table called `name` is the CUDA device at hand (never
    initialises CUDA where there is none)."""
    from lmperf.runtime import device as dev

    if not dev.cuda_available():
        return False
    import torch

    from lmperf.runtime.peaks import device_spec, spec_for_device_name

    here = spec_for_device_name(dev.device_name(torch.device("cuda")))
    wanted = device_spec(name)
    return here is not None and wanted is not None and here.name == wanted.name


def host_cost(host_us: float | None, gpu: str | None = None, spec=None) -> tuple[float, str]:
    """(seconds per op, where the figure comes from): `host_us` when given (it always wins, no
    probe); measured by `probe` on `spec`'s own ops when `gpu` is the GPU at hand; else the
    default HOST_OP_S."""
    if host_us is not None:
        return host_us * 1e-6, GIVEN
    if gpu is not None and spec is not None and local_gpu(gpu):
        seconds, ops = _measured(tiny(spec.with_(device="cuda")))
        return seconds, (f"measured on this host: {ops} ops of {spec.model or spec.size}'s "
                         f"{spec.precision} step on tiny tensors of this {gpu} (lmperf.estimate."
                         "host.probe)")
    return HOST_OP_S, HOST_OP_SOURCE


def tiny(spec):
    """`spec` at a size whose kernels take less than their launch: 8 dimensions per head, d_ff
    32, 2 blocks, 16 tokens, one sequence, a vocabulary of 256 (the same ops, the same regime)."""
    return replace(spec, d_model=8 * spec.num_heads, d_ff=32, num_layers=min(2, spec.num_layers),
                   context=16, model_context=16, batch=1, vocab_size=256, compile=False,
                   checkpoint=0, grad_accum=1)


@lru_cache(maxsize=16)
def _measured(spec) -> tuple[float, int]:
    import torch

    return probe(spec, torch.device(spec.device))


def probe(spec, device, steps: int = 3) -> tuple[float, int]:
    """(seconds the host takes per op, ops per step) of `spec`'s step (a tiny one: `tiny`) on
    `device`, its precision's autocast included, on tensors small enough that the device waits
    on the host: one step to warm up, one counted op by op, `steps` timed with one
    synchronisation at the end. Runs in the process that predicts (a job, or the CLI for
    --predict), never in the fork server, and only where the device is at hand."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from lmperf.runtime import device as dev
    from lmperf.runtime.precision import get_regime
    from lmperf.workload.build import prepare
    from lmperf.workload.steps import NO_OBSERVER

    class _Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            _Count.ops += 1
            return func(*args, **(kwargs or {}))

    run = prepare(spec, device, get_regime(spec.precision))
    run.step(run.state, NO_OBSERVER)
    with _Count():
        run.step(run.state, NO_OBSERVER)
    dev.synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        run.step(run.state, NO_OBSERVER)
    dev.synchronize(device)
    return (time.perf_counter() - start) / (steps * max(_Count.ops, 1)), _Count.ops
