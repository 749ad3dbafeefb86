"""Timing single kernel calls on CUDA in the style of triton.testing.do_bench (L2 flushed between
calls), for `lmperf attention`."""

from __future__ import annotations

import torch

from lmperf.runtime.device.select import cuda_index, synchronize
from lmperf.units import MIB


L2_FLUSH_MIN_BYTES = 256 * MIB


def l2_flush_buffer(device: torch.device) -> torch.Tensor | None:
    """A CUDA buffer at least twice the L2 cache (>= 256 MiB) whose `zero_()` evicts L2; None on
    the CPU."""
    if device.type != "cuda":
        return None
    l2 = getattr(torch.cuda.get_device_properties(cuda_index(device)), "L2_cache_size", 0) or 0
    return torch.empty(max(L2_FLUSH_MIN_BYTES, 2 * l2) // 4, dtype=torch.int32, device=device)


def time_cuda_calls(fn, device: torch.device, warmup: int, repeats: int,
                    grad_to_none: list[torch.Tensor] | tuple = ()) -> list[float]:
    """Milliseconds of each of `repeats` calls of `fn()` on CUDA, after `warmup` untimed calls.

    Before each timed call the L2 cache is flushed and the `.grad` of `grad_to_none` reset (so a
    backward does not time gradient accumulation); the flush lies outside the events. One
    synchronisation at the end: the calls queue back to back, as in do_bench.
    """
    if device.type != "cuda":
        raise ValueError("time_cuda_calls needs a CUDA device; time CPU calls with PhaseClock")
    flush = l2_flush_buffer(device)
    stream = torch.cuda.current_stream(cuda_index(device))  # the events time the run's device
    for _ in range(warmup):
        fn()
    synchronize(device)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(repeats)]
    for start, end in events:
        for t in grad_to_none:
            t.grad = None
        flush.zero_()
        start.record(stream)
        fn()
        end.record(stream)
    synchronize(device)
    return [start.elapsed_time(end) for start, end in events]
