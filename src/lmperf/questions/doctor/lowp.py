"""Each low-precision dtype's matmul speed relative to fp32 on this device, and on the CPU the
flags that make bf16 and fp16 native: the numbers behind the CPU defaults that leave slow
regimes out (`lmperf.runtime.lowp`).

It fails where a dtype that runs natively is slow: on the CPU a dtype whose flags say native
but whose matmul takes more than `lowp.SLOW_RATIO` x fp32's time (the defaults trust the flags
without measuring, so they would keep a slow regime); on a GPU a dtype its tensor cores run
(fp16 from sm_70, bf16 where native) that is not faster than fp32 (0.06x on the H200).
"""

from __future__ import annotations

import math

from lmperf.questions.doctor.checks import Context, Outcome, passed
from lmperf.runtime import device as dev
from lmperf.runtime import lowp

# n of the timed (n, n) @ (n, n) per device type: on the CPU the product the defaults decide
# from; on a GPU one large enough to be the tensor cores' time, not the launch's.
SIZES: dict[str, int] = {"cpu": lowp.MATMUL_N, "cuda": 4096}
LOW: tuple[str, ...] = ("bf16", "fp16")


def _times(ratio: float) -> str:
    return f"{ratio:.2f}x" if ratio < 1 else f"{ratio:.1f}x" if ratio < 10 else f"{ratio:.0f}x"


def check_lowp_matmuls(ctx: Context) -> Outcome:
    """Time one (n, n) matmul in bf16 and fp16 against fp32 on the check's device (fresh; on the
    CPU the ratios go to lowp's cache, which the defaults read) and, on the CPU, read the flags
    that make each dtype native; fails where a native dtype is slow (see the module)."""
    device = ctx.device
    n = SIZES.get(device.type, lowp.MATMUL_N)
    ratios = {d: lowp.measure_ratio(d, device, n=n) for d in LOW}
    parts = [f"{d} {_times(r)} fp32's time" for d, r in ratios.items()]
    values: dict[str, object] = {"n": n, "time_over_fp32": ratios}
    why = (f"median of {lowp.REPEATS} ({n}, {n}) @ ({n}, {n}) products, alternated with fp32"
           + ("; 1 thread" if device.type == "cpu" else "; TF32 as set"))
    if device.type == "cpu":
        flags = lowp.cpu_flags()
        native = {d: lowp.native_flags(d, flags) for d in LOW}
        lowp.store_ratios(ratios)
        values["native_flags"] = native
        parts.append("native: " + ("flags unreadable" if flags is None else ", ".join(
            f"{d} ({'/'.join(f)})" for d, f in native.items() if f) or "none"))
        slow = [d for d, r in ratios.items() if not native[d] and r > lowp.SLOW_RATIO]
        values["left_out_of_cpu_defaults"] = slow
        if slow:
            parts.append(f"{', '.join(slow)} regimes left out of the CPU defaults")
        why += (f"; without a native flag, above {lowp.SLOW_RATIO:g}x is left out of the "
                f"defaults; with one, it must not be above {lowp.SLOW_RATIO:g}x")
        slow_native = [d for d, r in ratios.items() if native[d] and r > lowp.SLOW_RATIO]
    else:
        major, _ = dev.cuda_capability(device) or (0, 0)
        tensor = {"bf16": dev.bf16_supported(device), "fp16": major >= 7}
        slow_native = [d for d, r in ratios.items() if tensor[d] and r >= 1]
        why += "; a dtype the tensor cores run must be faster than fp32"
    bad = [d for d, r in ratios.items() if not (math.isfinite(r) and r > 0)] + slow_native
    return passed(not bad, ("failing: " + ", ".join(bad) + "; " if bad else "")
                  + "; ".join(parts), why, **values)
