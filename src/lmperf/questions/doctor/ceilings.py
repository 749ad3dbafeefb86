"""The device's measured ceilings (the roof of lmperf's roofline), beside the datasheet peaks.

Measured with the thread count in force on the CPU (one thread, as every run), in fp32 (TF32
off), bf16 and fp16 on CUDA. A ceiling that is not positive and finite fails (the roofline
divides by it), and so does one below `MIN_FLOPS_SHARE` / `MIN_BANDWIDTH_SHARE` of a datasheet
peak: the probe missed the device's peak (issue 34: the H200's fp32 at a 128 x 128 product, 0.2%
of its peak, said ok), or the device runs throttled; and a matmul above its peak (the peak
table's entry is wrong for this device, MFU's denominator).
"""

from __future__ import annotations

import math

from lmperf.questions.doctor.checks import Context, Outcome, passed

DTYPES = {"cpu": ("fp32", "bf16"), "cuda": ("fp32", "bf16", "fp16")}
MIN_FLOPS_SHARE = 0.3
"""A large cuBLAS GEMM reaches 60-90% of the dense datasheet peak (bf16 at 8192: 81% on the
H200); below 30% the probe measured something else than the device's peak. Above 100% the
entry is below what the device did (a wrong entry: MFU would exceed 100%)."""
MIN_BANDWIDTH_SHARE = 0.5
"""A copy or triad over 1 GiB reaches 80-90% of the datasheet's bandwidth (90% on the H200)."""


def check_ceilings(ctx: Context) -> Outcome:
    """Measure the attained matmul FLOP/s (fp32, bf16; fp16 too on CUDA) and the copy / triad
    bandwidth on this device (`runtime.ceilings`); values: the ceilings and the peaks."""
    from lmperf.questions.doctor.spec import CPU_WORKERS
    from lmperf.runtime.ceilings import datasheet_peaks, measure_ceilings
    from lmperf.runtime.precision import get_regime, matmul_precision

    with matmul_precision(get_regime("fp32")):  # fp32 FMA, TF32 off, as the peak table's 'fp32'
        ceilings = measure_ceilings(ctx.device, DTYPES.get(ctx.device.type, ("fp32",)))
    peaks = datasheet_peaks(ceilings.device_name)
    flops = ", ".join(
        f"{d} {v / 1e9:.1f} GFLOP/s" + (f" ({v / peaks[d]:.0%} of peak)" if d in peaks else "")
        for d, v in ceilings.matmul_flops_per_s.items())
    bw = ceilings.bandwidth_bytes_per_s
    # The CPU's checks run CPU_WORKERS at a time (doctor.spec) on cores they share: say so where
    # the figures are, since `lmperf profile` measures the same ceilings alone (issue 28).
    alongside = (f"beside up to {CPU_WORKERS - 1} other checks: " if ctx.device.type == "cpu"
                 and CPU_WORKERS > 1 else "")
    result = (f"{alongside}matmul {flops}; bandwidth {bw / 1e9:.1f} GB/s (copy "
              f"{ceilings.copy_bytes_per_s / 1e9:.1f}, triad {ceilings.triad_bytes_per_s / 1e9:.1f})"
              + (f", {bw / peaks['bandwidth']:.0%} of peak" if "bandwidth" in peaks else "")
              + f"; {ceilings.op_overhead_s * 1e6:.1f} us per eager op call"
              + (f"; {ceilings.threads} thread(s)" if ctx.device.type == "cpu" else ""))
    values = list(ceilings.matmul_flops_per_s.values()) + [bw, ceilings.op_overhead_s]
    shares = {d: v / peaks[d] for d, v in ceilings.matmul_flops_per_s.items() if d in peaks}
    low = [f"{d} {v:.1%} of its peak (n = {ceilings.matmul_n[d]})" for d, v in shares.items()
           if not MIN_FLOPS_SHARE <= v <= 1]
    if "bandwidth" in peaks and bw / peaks["bandwidth"] < MIN_BANDWIDTH_SHARE:
        low.append(f"bandwidth {bw / peaks['bandwidth']:.1%} of the datasheet's")
    good = all(math.isfinite(v) and v > 0 for v in values) and not low
    return passed(good, ("outside the bounds: " + "; ".join(low) + "; " if low else "") + result,
                  f"every ceiling positive and finite (the roofline divides by them); where the "
                  f"datasheet knows the device, matmuls {MIN_FLOPS_SHARE:.0%}-100% of their "
                  f"dtype's peak and bandwidth {MIN_BANDWIDTH_SHARE:.0%} of its; best of 3 calls "
                  "each", ceilings=ceilings.to_dict(), peaks=peaks, shares=shares)
