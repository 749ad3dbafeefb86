"""nccl-tests' bandwidth definitions (its doc/PERFORMANCE.md), without torch.

algbw = S / t with S the whole array of the collective (all_gather's output, reduce_scatter's
input, all_to_all's send buffer), in GB/s (GB = 1e9 bytes); busbw = algbw x a factor that makes
the figure comparable with a link's peak bandwidth whatever the number of ranks n.
"""

from __future__ import annotations


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw / algbw for `collective` over `n` ranks.

    all_reduce 2(n-1)/n (a reduce-scatter then an all-gather: every byte crosses 2(n-1) links
    out of n); all_gather, reduce_scatter and all_to_all (n-1)/n (S the whole array: each rank
    holds, sends or receives S/n per peer); broadcast 1 (all S leaves the root).
    """
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if collective == "broadcast":
        return 1.0
    raise ValueError(f"unknown collective {collective!r}")


def bandwidths(size_bytes: int, time_s: float, collective: str, n: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (GB = 1e9 bytes), nccl-tests' definitions: algbw = S / t."""
    algbw = size_bytes / time_s / 1e9
    return algbw, algbw * bus_factor(collective, n)
