"""What only a GPU can show: TF32 regimes change cuBLAS's results, the per-call timer of
`lmperf attention` agrees with the host clock, and the out-of-memory snapshot dump is written
and readable (a GEMM against the peak table's figure: the measured ceilings' check).

CUDA only; CUDA's checks run one job at a time, so the speed checks have the GPU to themselves.
"""

from __future__ import annotations

import time

import torch

from lmperf.questions.doctor.checks import Context, Outcome, fail, passed, skip
from lmperf.runtime import device as dev
from lmperf.units import GIB

TF32_N = 2048
"""(N, N) @ (N, N) fp32: the error TF32 leaves (10-bit mantissa) is ~1e-3 of |ref|, IEEE fp32's
~1e-6: three orders of magnitude apart, so the two regimes cannot be confused."""
TIMER_N = 4096
TIMER_RATIO = (0.75, 1.25)
"""Per-call event time (L2 flushed, as `lmperf attention` times) over the host clock's average of
back-to-back calls: a compute-bound GEMM runs at the same speed either way, within 25%."""


def check_tf32(ctx: Context) -> Outcome:
    """lmperf's 'fp32' and 'tf32' regimes (runtime.precision.matmul_precision) on one fp32 GEMM:
    TF32 must change cuBLAS's result on sm_80+ (and must not below, where it does not exist)."""
    from lmperf.questions.amp.base import max_rel_error
    from lmperf.runtime.precision import get_regime, matmul_precision

    device = ctx.device
    gen = dev.make_generator(device, 0)
    a, b = (torch.randn(TF32_N, TF32_N, generator=gen, device=device) for _ in range(2))
    ref = a.double() @ b.double()
    errors, states = {}, {}
    for name in ("fp32", "tf32"):
        with matmul_precision(get_regime(name)):
            errors[name] = max_rel_error(a @ b, ref)
            states[name] = dev.tf32_state()
    major, _ = dev.cuda_capability(device) or (0, 0)
    result = (f"max |err| / max |ref|: fp32 regime {errors['fp32']:.1e}, tf32 regime "
              f"{errors['tf32']:.1e} (sm_{major}x)")
    if major < 8:
        return passed(errors["tf32"] == errors["fp32"], result, "no TF32 below sm_80: the "
                      "regimes must give the same result", errors=errors, states=states)
    return passed(errors["fp32"] < 1e-5 and errors["tf32"] > 30 * errors["fp32"], result,
                  "fp32 IEEE-accurate (< 1e-5); tf32 at least 30x less accurate (10-bit mantissa)",
                  errors=errors, states=states)


def check_call_timer(ctx: Context) -> Outcome:
    """`runtime.device.time_cuda_calls` (lmperf attention's per-call timer: events, L2 flushed)
    against the host clock's average over back-to-back synchronised calls of the same GEMM."""
    from lmperf.measure.stats import summarize

    device = ctx.device
    dtype = torch.bfloat16 if dev.bf16_supported(device) else torch.float16
    gen = dev.make_generator(device, 0)
    a, b = (torch.randn(TIMER_N, TIMER_N, generator=gen, device=device, dtype=dtype)
            for _ in range(2))
    per_call = dev.time_cuda_calls(lambda: a @ b, device, warmup=5, repeats=20)
    event_ms = summarize(per_call)["median"]
    calls = 20
    dev.synchronize(device)
    begin = time.perf_counter()
    for _ in range(calls):
        a @ b
    dev.synchronize(device)
    host_ms = (time.perf_counter() - begin) * 1e3 / calls
    ratio = event_ms / host_ms
    low, high = TIMER_RATIO
    result = (f"per call {event_ms:.3f} ms (events, median of 20), host clock {host_ms:.3f} ms "
              f"per call: ratio {ratio:.2f}")
    if min(per_call) <= 0:
        return fail(result, "every timed call must take a positive time", per_call_ms=per_call)
    return passed(low <= ratio <= high, result, f"ratio within {low:g}-{high:g} (a compute-bound "
                  "GEMM, cold L2 or not)", per_call_ms=per_call, host_ms=host_ms)


def check_oom_snapshot(ctx: Context) -> Outcome:
    """The out-of-memory dump `lmperf memory --snapshot` arms: an allocation larger than the GPU
    runs out of memory, the observer writes the snapshot, and the reader finds the OOM in it."""
    from lmperf.questions.memory.snapshot_read import summarize_snapshot

    device = ctx.device
    path = ctx.workdir / "oom_snapshot.pickle"
    if not dev.on_oom_dump(device, path):
        return skip("this torch has no out-of-memory observer hook (an OOM dumps after the fact)")
    before = dev.oom_dumps()
    raised = ""
    try:
        dev.start_memory_history(device, max_entries=1000)
        try:
            total = dev.device_memory_gib(device) or 0.0
            torch.empty(int((total + 8) * GIB), dtype=torch.uint8, device=device)
        except Exception as exc:  # noqa: BLE001 - the OOM is the point
            if not dev.is_oom(exc):
                raise
            raised = type(exc).__name__
        finally:
            dev.stop_memory_history(device)
    finally:
        dev.cancel_oom_dump()
        dev.free_memory(device)
    if not raised:
        return fail("the oversized allocation succeeded", "it must run out of memory")
    if not path.exists():
        return fail(f"{raised} raised, no snapshot at {path.name}",
                    "the observer must dump on out-of-memory", dumps=dev.oom_dumps() - before)
    summary = summarize_snapshot(path)
    result = (f"{raised} -> {path.stat().st_size / 2**10:.0f} KiB snapshot, {summary.ooms} OOM "
              f"event(s), {summary.segments} segments")
    return passed(summary.ooms >= 1 and dev.oom_dumps() > before, result,
                  "the dump must be written by the observer and hold the OOM event",
                  ooms=summary.ooms, dumps=dev.oom_dumps() - before)
