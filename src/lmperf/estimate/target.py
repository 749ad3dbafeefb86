"""The device an estimate is for, named once (`--gpu NAME --gpus N --gpus-per-node G --gib G
--host-us US`, core.vocabulary.TARGET) and built here once: a GPU's figures from the peak table
(`runtime.peaks`), held to the attained fractions FRACTIONS, driven by a host taking
`host_op_s` per op (`estimate.host`); or the CPU at hand, its figures measured now."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from lmperf.errors import SpecError
from lmperf.estimate.host import GIVEN, HOST_OP_S, HOST_OP_SOURCE  # noqa: F401 (re-exported)
from lmperf.estimate.time_model import Fraction, Target
from lmperf.units import GIB



@dataclass(frozen=True)
class Cluster:
    """Where a plan runs: `gpus` devices, `per_node` per node, `budget` bytes each, a time
    target (`time_model.Target`: its peaks are MFU's) and links (`comm.Link`, or one per
    collective with '*' the default)."""

    name: str
    gpus: int
    per_node: int
    budget: float
    target: Target
    link: object
    device: str  # 'cuda' or 'cpu'
    blocking: bool = False  # collectives block (gloo's on CPU ranks sharing the cores)
    share: float = 1.0  # of a core each CPU rank gets when ranks outnumber the cores


# op class -> attained fractions of peak (compute, memory), each with its source in short; the
# sources in full: docs/commands/plan.md, "The time model"
FRACTIONS: dict[str, Fraction] = {
    "matmul": Fraction(0.7, 0.7, "GEMMs of LM shapes: 60-80% of peak (NVIDIA DL Perf. Guide)"),
    "attention": Fraction(0.5, 0.5, "FlashAttention-2 (Dao 2023): 50-73% of A100 peak forward"),
    "elementwise/norm": Fraction(1.0, 0.8, "streaming kernels: 80-90% of DRAM peak (STREAM, BabelStream)"),
    "optimizer": Fraction(1.0, 0.6, "assumed: fused AdamW streams its state at ~60% of DRAM"),
}
# Hopper runs torch's flash attention (FlashAttention-2's kernels, no TMA or wgmma) at a lower
# share of its peak: "FlashAttention-2 ... achieving only 35% utilization on the H100 GPU"
# (FlashAttention-3, Shah et al. 2024)
HOPPER = ("H100-SXM", "H100-PCIe", "H100-96GB", "H200")
HOPPER_ATTENTION = Fraction(0.35, 0.35, "FlashAttention-2 on H100: 35% of peak (FlashAttention-3"
                                        " paper, Shah et al. 2024)")


def gpu_targets(name: str, host_op_s: float = HOST_OP_S, source: str | None = None) -> list[Target]:
    """The Targets a GPU name means: one device of the peak table, or every device of a family
    the name leaves ambiguous ('A100': its 40GB / 80GB, SXM / PCIe forms, whose bandwidths
    differ), driven by a host that takes `host_op_s` per op, the figure's `source` recorded
    (None: the default's, or 'given' for another figure). Raises SpecError for an unknown name
    or a device without a published peak."""
    from lmperf.runtime import peaks

    found = peaks.device_spec(name)
    specs = [found] if found is not None else [
        d for d in peaks.DEVICES.values() if d.name.lower().startswith(name.lower())]
    if not specs:
        peaks.require_device(name)  # raises the one-line error naming the accepted GPUs
    source = source or (HOST_OP_SOURCE if host_op_s == HOST_OP_S else GIVEN)
    out = []
    for spec in specs:
        flops = {d: spec.peak_tflops(d) * 1e12 for d in peaks.DTYPES if spec.peak_tflops(d)}
        if not flops.get("bf16") and not flops.get("fp16"):
            raise SpecError(f"{spec.name} has no published dense peak: nothing to predict from")
        fractions = {**FRACTIONS, "attention": HOPPER_ATTENTION} if spec.name in HOPPER \
            else FRACTIONS
        out.append(Target(spec.name, flops, spec.memory_bandwidth, fractions, host_op_s, source,
                          False, spec.source))
    return out


def cpu_target(threads: int | None = None) -> Target:
    """This CPU from the ceilings it measures now (fp32, bf16, fp16 square matmuls, the faster
    of a copy and a triad, one small op's host time, a fresh output's page faults;
    `runtime.ceilings`) with `threads` torch threads (None: lmperf's default, one)."""
    import torch

    from lmperf.core.launch import cpu_threads
    from lmperf.runtime.ceilings import fresh_write, measure_ceilings

    with cpu_threads(1 if threads is None else threads):
        c = measure_ceilings(torch.device("cpu"), ("fp32", "bf16", "fp16"))
        fresh = fresh_write(torch.device("cpu"))
    caveats = {d: (f"{d} on this CPU: one square product's rate ({c.matmul_n[d]}^3); without "
                   f"native {d} a CPU's rate depends on shapes and layouts the count does not see")
               for d in c.matmul_n if d != "fp32"}
    return Target(f"this CPU ({c.device_name}, {c.threads} thread(s), measured)",
                  dict(c.matmul_flops_per_s), c.bandwidth_bytes_per_s, None, c.op_overhead_s,
                  "measured now: a one-element add with autograd, per call", True,
                  "measured now (lmperf.runtime.ceilings)", caveats, fresh)


def core_share(ranks: int) -> tuple[float, int]:
    """(the share of a core each of `ranks` ranks on this machine gets, at most 1; the cores)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(1.0, (cores or 1) / ranks), cores or 1


def shared(target: Target, ranks: int) -> Target:
    """`target` (one thread's ceilings) as each of `ranks` ranks on this machine's cores gets it:
    more ranks than cores share them, each at cores / ranks of the rate and of the host's speed
    (4 ranks on 2 cores: half); unchanged where every rank has a core."""
    share, cores = core_share(ranks)
    if share == 1.0:
        return target
    return dataclasses.replace(
        target, name=target.name.removesuffix(")") + f"; {ranks} ranks on {cores} cores: "
        f"{share:.2g} of one each)", flops_per_s={d: r * share for d, r in
                                                  target.flops_per_s.items()},
        bandwidth=target.bandwidth * share, host_op_s=target.host_op_s / share,
        fresh_bytes_per_s=target.fresh_bytes_per_s and target.fresh_bytes_per_s * share)


# gloo over loopback between 2 ranks of a 2-core AMD EPYC (torch 2.13), per collective: the
# effective bus bandwidth (GB/s) and latency (us) `estimate.comm.fit_from_records` fitted to
# `lmperf dist comm` 1 KiB..64 MiB (tests/data/dist_comm_gloo, 2026-11-27); at 4 ranks gloo is
# slower (docs/accuracy.md). Inside a training step the same collectives measured 1.1-3.3x these.
CPU_LINKS: dict[str, tuple[float, float]] = {
    "all_reduce": (1.25, 598.0), "all_gather": (1.12, 294.0), "reduce_scatter": (0.64, 512.0),
    "broadcast": (3.59, 200.0)}


def cluster(gpu: str | None, gpus: int, *, gpus_per_node: int = 8, gib: float | None = None,
            host_us: float | None = None, probe=None,
            bandwidth: float | None = None, node_bandwidth: float | None = None) -> Cluster:
    """THE Cluster of `gpus` devices of `gpu` (a name of the peak table), or of this CPU's ranks
    (`gpu` None: one thread each, its ceilings measured now, gloo between them); `gib` replaces
    the device's memory as the budget; the host's time per op as `estimate.host.host_cost`
    gives it (`probe`: a RunSpec whose ops measure it when `gpu` is the GPU at hand).
    `bandwidth` / `node_bandwidth` (GB/s per device and direction, within / between nodes)
    replace the datasheet's. SpecError for an unknown GPU."""
    from lmperf.estimate.comm import Link
    from lmperf.estimate.host import host_cost
    from lmperf.runtime.peaks import require_device

    if gpu is None:
        target = shared(cpu_target(1), gpus)
        link = {c: Link(w, base_us=us, intra_hop_us=0.0, per_node=gpus_per_node)
                for c, (w, us) in CPU_LINKS.items()}
        link["*"] = link["all_reduce"]
        return Cluster(target.name, gpus, gpus_per_node, (gib or 0) * GIB, target, link, "cpu",
                       blocking=True, share=core_share(gpus)[0])
    spec = require_device(gpu)
    target = gpu_targets(spec.name, *host_cost(host_us, spec.name, probe))[0]
    # between nodes: 50 GB/s per GPU (one NDR 400 Gb/s NIC each; torch inductor's comm model
    # assumes the same), an assumption: the peak table has no network
    inter = node_bandwidth or (50.0 if gpus > gpus_per_node else None)
    link = Link(bandwidth or spec.link_bandwidth / 1e9, inter, per_node=gpus_per_node)
    return Cluster(spec.name, gpus, gpus_per_node, (gib or spec.memory_gib) * GIB, target, link,
                   "cuda")
