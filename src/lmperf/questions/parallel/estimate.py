"""`lmperf dist --estimate`: memory per rank and communication per step on clusters you do not have.

Every number is one of these hand-checkable formulas (P parameters, N ranks, W link bandwidth in
GB/s with GB = 1e9 bytes, c bytes per element communicated, GiB = 2**30 bytes):

Model states, the course's accounting: fp32 master weights (4 P), fp32 accumulated gradients
(4 P) and AdamW's two fp32 moments (8 P): 16 P bytes on one device. Per rank:
    ddp           4 P + 4 P + 8 P              (everything replicated)
    zero1         4 P + 4 P + 8 P / N          (optimizer state sharded)
    zero2         4 P + (4 P + 8 P) / N        (and gradients)
    fsdp (zero3)  (4 P + 4 P + 8 P) / N        (and parameters)
Activations (with --batch and --context) are per rank and not sharded by any of these.

Bytes each rank sends per step on a ring (nccl-tests' bus convention), S = c P:
    ddp, zero2, zero1 (reduce-scatter + all-gather)   2 (N-1)/N S   (one all-reduce's worth)
    zero1 (all-reduce + broadcast, lmperf's zero1)     2 (N-1)/N S + S   (-> 1.5x ddp)
    fsdp (gather in forward and backward, reduce-scatter gradients)   3 (N-1)/N S
Communication time = bytes / W. Compute time per step = 6 P x tokens per rank / C (C: achieved
TFLOP/s per device), with the global batch fixed, so tokens per rank = global tokens / N.
A step is communication-bound (if nothing overlaps) when communication time > compute time; the
largest N before that is found by bisection (communication grows with N, compute shrinks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GIB = 2**30
GB = 1e9

# strategy -> (what it shards, bytes per rank as a function of P and N)
_STATE_BYTES = {
    "ddp": lambda p, n: 16 * p,
    "zero1": lambda p, n: 8 * p + 8 * p / n,
    "zero2": lambda p, n: 4 * p + 12 * p / n,
    "fsdp": lambda p, n: 16 * p / n,
}
# strategy -> bytes sent per rank per step, for S communicated bytes and N ranks
_COMM_BYTES = {
    "ddp": lambda s, n: 2 * (n - 1) / n * s,
    "zero1": lambda s, n: 2 * (n - 1) / n * s,
    "zero1-ar-bcast": lambda s, n: 2 * (n - 1) / n * s + (s if n > 1 else 0),
    "zero2": lambda s, n: 2 * (n - 1) / n * s,
    "fsdp": lambda s, n: 3 * (n - 1) / n * s,
}
STRATEGIES: tuple[str, ...] = tuple(_COMM_BYTES)


@dataclass(frozen=True)
class Shape:
    """What the estimate needs of a model: parameters P, and for activations the widths."""

    name: str
    params: int
    d_model: int
    d_ff: int
    num_layers: int
    ffn_only: bool = False


def ffn_only_shape(d_model: int, d_ff: int, num_layers: int) -> Shape:
    """The course's accounting model: per block two Linear layers d_model -> d_ff -> d_model
    (no attention, embeddings or output layer): P = 2 x d_model x d_ff x layers."""
    return Shape(f"ffn d={d_model} ff={d_ff} L={num_layers}", 2 * d_model * d_ff * num_layers,
                 d_model, d_ff, num_layers, ffn_only=True)


def saved_activation_bytes(shape: Shape, tokens: int, dtype_bytes: int = 2) -> int:
    """What backward needs per rank for the FFN-only model: each block's input (d_model) and
    first layer's output (d_ff) per token, in the activation dtype (bf16: 2 bytes)."""
    return shape.num_layers * tokens * (shape.d_model + shape.d_ff) * dtype_bytes


def state_bytes(strategy: str, params: int, n: int) -> float:
    """Model-state bytes per rank (see the module docstring); zero1-ar-bcast holds zero1's."""
    return _STATE_BYTES["zero1" if strategy == "zero1-ar-bcast" else strategy](params, n)


def comm_bytes(strategy: str, params: int, n: int, comm_dtype_bytes: int) -> float:
    """Bytes each rank sends per step (see the module docstring)."""
    return _COMM_BYTES[strategy](params * comm_dtype_bytes, n)


def compute_seconds(params: int, tokens_per_rank: float, tflops: float) -> float:
    """6 P tokens / C: forward (2 P per token) + backward (4 P per token) at C TFLOP/s."""
    return 6 * params * tokens_per_rank / (tflops * 1e12)


def largest_n(strategy: str, params: int, global_tokens: int, bandwidth_gbps: float,
              tflops: float, comm_dtype_bytes: int, cap: int = 2**24) -> int | None:
    """The largest N at which communication time <= compute time per step, with the global
    batch fixed; None if even N = 2 is communication-bound; `cap` if never within it."""
    def ok(n: int) -> bool:
        comm = comm_bytes(strategy, params, n, comm_dtype_bytes) / (bandwidth_gbps * GB)
        return comm <= compute_seconds(params, global_tokens / n, tflops)

    if not ok(2):
        return None
    lo, hi = 2, cap
    if ok(hi):
        return cap
    while hi - lo > 1:  # ok(lo) and not ok(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def estimate_rows(shape: Shape, world_sizes: list[int], *, bandwidth_gbps: float,
                  gpu_gib: float, tflops: float, global_tokens: int, comm_dtype_bytes: int,
                  activation_bytes: float = 0.0) -> list[dict]:
    """One row per (strategy, N): memory per rank, whether it fits, communication and compute
    per step, and the largest N before communication dominates."""
    rows = []
    for n in world_sizes:
        for strategy in STRATEGIES:
            states = state_bytes(strategy, shape.params, n)
            total = states + activation_bytes
            sent = comm_bytes(strategy, shape.params, n, comm_dtype_bytes)
            comm_s = sent / (bandwidth_gbps * GB)
            compute_s = compute_seconds(shape.params, global_tokens / n, tflops)
            rows.append({
                "strategy": strategy, "world_size": n, "params": shape.params,
                "states_gib": states / GIB, "activations_gib": activation_bytes / GIB,
                "total_gib": total / GIB, "fits": total <= gpu_gib * GIB,
                "min_devices_states": _min_devices(strategy, shape.params, gpu_gib),
                "comm_gb": sent / GB, "comm_ms": comm_s * 1e3, "compute_ms": compute_s * 1e3,
                "comm_bound": comm_s > compute_s,
                "largest_n_compute_bound": largest_n(strategy, shape.params, global_tokens,
                                                     bandwidth_gbps, tflops, comm_dtype_bytes),
            })
    return rows


def _min_devices(strategy: str, params: int, gpu_gib: float) -> int | None:
    """The fewest ranks whose per-rank model states fit in `gpu_gib` (None if none does)."""
    floor = {"ddp": 16, "zero1": 8, "zero1-ar-bcast": 8, "zero2": 4, "fsdp": 0}[strategy] * params
    if floor >= gpu_gib * GIB:
        return None
    sharded = 16 * params - floor  # the part divided by N
    return max(1, math.ceil(sharded / (gpu_gib * GIB - floor)))
