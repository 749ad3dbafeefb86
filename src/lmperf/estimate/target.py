"""The device an estimate is for, named once (`--gpu NAME --gpus N --gpus-per-node G --gib G`),
or the CPU at hand: a GPU's figures from the peak table (`runtime.peaks`), held to the attained
fractions FRACTIONS, driven by a host taking `host_op_s` per op; the CPU's measured now."""

from __future__ import annotations

from lmperf.errors import SpecError
from lmperf.estimate.time_model import Fraction, Target

HOST_OP_S = 5e-6
HOST_OP_SOURCE = (
    "default 5 us per aten op call (--host-us): the low end of the 5-25 us that Python, the "
    "dispatcher and a kernel launch usually cost per eager op, what a current server CPU "
    "attains; CS336's host-bound runs imply 17 us (A100, 2025) and at most 5 us (B200, "
    "2026): docs/accuracy.md")

# op class -> attained fractions of peak (compute, memory), each with its source in short; the
# sources in full: matmul, NVIDIA Deep Learning Performance Guide, 'Matrix Multiplication
# Background' (GEMMs of LM shapes at roughly 60-80% of dense peak) and Megatron-LM (Narayanan et
# al., SC'21: 52% of peak for a whole training step); attention, FlashAttention-2 (Dao, 2023:
# 50-73% of A100 peak forward, less backward); elementwise/norm, an assumption: unfused
# elementwise and reduction kernels at about half of DRAM peak (STREAM-like copies reach 80-90%,
# BabelStream, Deakin et al. 2018; broadcasts, strides and small tensors less); optimizer, an
# assumption: fused AdamW streams parameters, gradients and both moments once, long contiguous
# reads at ~60% of DRAM peak.
FRACTIONS: dict[str, Fraction] = {
    "matmul": Fraction(0.7, 0.7, "GEMMs of LM shapes: 60-80% of peak (NVIDIA DL Perf. Guide)"),
    "attention": Fraction(0.5, 0.5, "FlashAttention-2 (Dao 2023): 50-73% of A100 peak forward"),
    "elementwise/norm": Fraction(1.0, 0.5, "assumed: ~50% of DRAM peak (STREAM copies: 80-90%)"),
    "optimizer": Fraction(1.0, 0.6, "assumed: fused AdamW streams its state at ~60% of DRAM"),
}
def gpu_targets(name: str, host_op_s: float = HOST_OP_S, given: bool = False) -> list[Target]:
    """The Targets a `--predict` GPU name means: one device of the peak table, or every device
    of a family the name leaves ambiguous ('A100': its 40GB / 80GB, SXM / PCIe forms, whose
    bandwidths differ), driven by a host that takes `host_op_s` per op (`given`: the user's
    --host-us, else the default's source is recorded). Raises SpecError for an unknown name."""
    from lmperf.runtime import peaks

    found = peaks.device_spec(name)
    specs = [found] if found is not None else [
        d for d in peaks.DEVICES.values() if d.name.lower().startswith(name.lower())]
    if not specs:
        peaks.require_device(name)  # raises the one-line error naming the accepted GPUs
    source = "given (--host-us)" if given or host_op_s != HOST_OP_S else HOST_OP_SOURCE
    out = []
    for spec in specs:
        flops = {d: spec.peak_tflops(d) * 1e12 for d in peaks.DTYPES if spec.peak_tflops(d)}
        if not flops:
            raise SpecError(f"{spec.name} has no published dense peak: nothing to predict from")
        out.append(Target(spec.name, flops, spec.memory_bandwidth, FRACTIONS, host_op_s, source,
                          False, spec.source))
    return out


def cpu_target(threads: int | None = None) -> Target:
    """This CPU from the ceilings it measures now (fp32, bf16, fp16 square matmuls, the faster
    of a copy and a triad, one small op's host time; `runtime.ceilings`) with `threads` torch
    threads (None: lmperf's default, one)."""
    import torch

    from lmperf.core.launch import cpu_threads
    from lmperf.runtime.ceilings import measure_ceilings

    with cpu_threads(1 if threads is None else threads):
        c = measure_ceilings(torch.device("cpu"), ("fp32", "bf16", "fp16"))
    caveats = {d: (f"{d} on this CPU: one square product's rate ({c.matmul_n[d]}^3); without "
                   f"native {d} a CPU's rate depends on shapes and layouts the count does not see")
               for d in c.matmul_n if d != "fp32"}
    return Target(f"this CPU ({c.device_name}, {c.threads} thread(s), measured)",
                  dict(c.matmul_flops_per_s), c.bandwidth_bytes_per_s, None, c.op_overhead_s,
                  "measured now: a one-element add with autograd, per call", True,
                  "measured now (lmperf.runtime.ceilings)", caveats)




# gloo over loopback between 2 ranks of a 2-core AMD EPYC (torch 2.13), per collective: the
# effective bus bandwidth (GB/s) and latency (us) `estimate.comm.fit_from_records` fitted to
# `lmperf dist comm` 1 KiB..64 MiB (tests/data/dist_comm_gloo, 2026-11-27); at 4 ranks gloo is
# slower (docs/accuracy.md). Inside a training step the same collectives measured 1.1-3.3x these.
CPU_LINKS: dict[str, tuple[float, float]] = {
    "all_reduce": (1.25, 598.0), "all_gather": (1.12, 294.0), "reduce_scatter": (0.64, 512.0),
    "broadcast": (3.59, 200.0)}


def cluster(gpu: str | None, gpus: int, *, gpus_per_node: int = 8, gib: float | None = None,
            host_us: float | None = None, blocking: bool = False):
    """The `estimate.plan.Cluster` of `gpus` devices of `gpu` (a name of the peak table), or of
    this CPU's ranks (`gpu` None: one thread each, its ceilings measured now, gloo between
    them); `gib` replaces the device's memory as the budget. SpecError for an unknown GPU."""
    from lmperf.estimate.comm import Link
    from lmperf.estimate.plan import GIB, Cluster
    from lmperf.runtime.peaks import require_device

    if gpu is None:
        target = cpu_target(1)
        link = {c: Link(w, base_us=us, intra_hop_us=0.0, per_node=gpus_per_node)
                for c, (w, us) in CPU_LINKS.items()}
        link["*"] = link["all_reduce"]
        return Cluster(target.name, gpus, gpus_per_node, (gib or 0) * GIB, target, link, "cpu",
                       blocking=True)
    spec = require_device(gpu)
    target = gpu_targets(spec.name, HOST_OP_S if host_us is None else host_us * 1e-6,
                         given=host_us is not None)[0]
    # between nodes: 50 GB/s per GPU (one NDR 400 Gb/s NIC each; torch inductor's comm model
    # assumes the same), an assumption: the peak table has no network
    link = Link(spec.link_bandwidth / 1e9, 50.0 if gpus > gpus_per_node else None,
                per_node=gpus_per_node)
    return Cluster(spec.name, gpus, gpus_per_node, (gib or spec.memory_gib) * GIB, target, link,
                   "cuda", blocking=blocking)
