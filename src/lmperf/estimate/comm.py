"""Time of one collective, NCCL's latency + bandwidth model per algorithm, and what a training step
leaves exposed. The formulas with a worked example, NCCL's constants and what is not modelled:
docs/commands/plan.md, "The collective model"."""

from __future__ import annotations

import math
from dataclasses import dataclass

from lmperf.estimate.formulas import bus_factor

BACKWARD_SHARE = 2 / 3  # backward's part of a step's compute: 4 P of 6 P FLOPs per token
TREE_EFFICIENCY = 0.92  # tuning.cc: tree busBw x .92 (then x .5: bus -> algorithm bandwidth)


@dataclass(frozen=True)
class Link:
    """Bandwidths per device and direction (GB/s) and latencies (us) of the devices a group runs
    on. Defaults: NCCL's Simple-protocol constants on NVLink (see the module docstring)."""

    intra_gbps: float             # within a node (NVLink per direction, PCIe for PCIe cards)
    inter_gbps: float | None = None  # between nodes, per device (None: one domain, no network)
    per_node: int = 8             # devices per node
    base_us: float = 8.4          # per collective (tuning.cc baseLatencies, Simple)
    intra_hop_us: float = 3.4     # per step inside a node (hwLatencies NVLink ring Simple)
    inter_hop_us: float = 14.0    # per step across the network (hwLatencies NET Simple)

    def nodes(self, n: int) -> int:
        return 1 if self.inter_gbps is None else math.ceil(n / self.per_node)

    def gbps(self, n: int) -> float:
        """The slowest link a group of `n` crosses."""
        return self.intra_gbps if self.nodes(n) == 1 else min(self.intra_gbps, self.inter_gbps)


def _ring(collective: str, nbytes: float, n: int, link: Link) -> float:
    k = link.nodes(n)
    steps, net = (2 * (n - 1), 2 * (k - 1)) if collective == "all_reduce" else (n - 1, k - 1)
    latency = link.base_us + (steps - net) * link.intra_hop_us + net * link.inter_hop_us
    return latency * 1e-6 + nbytes * bus_factor(collective, n) / (link.gbps(n) * 1e9)


def _tree(nbytes: float, n: int, link: Link) -> float:
    k = link.nodes(n)
    hops = (n / k - 1) * link.intra_hop_us + math.log2(k) * link.inter_hop_us  # up (or down)
    latency = link.base_us + 2 * hops
    return latency * 1e-6 + 2 * nbytes / (TREE_EFFICIENCY * link.gbps(n) * 1e9)


def collective_seconds(collective: str, nbytes: float, n: int, link: Link,
                       algorithm: str = "auto") -> float:
    """Seconds for one `collective` ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
    of S = `nbytes` over `n` devices by `algorithm` ("ring", "tree": all_reduce only, "auto": the
    faster); 0 for n = 1."""
    if collective not in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
        raise ValueError(f"unknown collective {collective!r}")
    if algorithm not in ("ring", "tree", "auto"):
        raise ValueError(f"unknown algorithm {algorithm!r}: ring, tree or auto")
    if algorithm == "tree" and collective != "all_reduce":
        raise ValueError(f"NCCL runs {collective} as a ring only (tree: all_reduce)")
    if n <= 1:
        return 0.0
    if algorithm == "ring" or collective != "all_reduce":
        return _ring(collective, nbytes, n, link)
    if algorithm == "tree":
        return _tree(nbytes, n, link)
    return min(_ring(collective, nbytes, n, link), _tree(nbytes, n, link))


def fit_from_records(records: list[dict]) -> dict[tuple[str, int], Link]:
    """(collective, world size) -> the Link that makes `collective_seconds(..., algorithm="ring")`
    reproduce `lmperf dist comm`'s ok records: alpha (base_us, no per-hop term: one world size
    cannot separate them) and W (intra_gbps) fitted to t = alpha + S f / W by least squares on
    RELATIVE residuals (each point weighted 1/t, so 1 KiB counts as much as 64 MiB), with
    alpha >= 0. W is the backend's effective bus bandwidth: gloo's reduce_scatter, an all-reduce
    in disguise (questions.parallel.comm.NOT_COMPARABLE), fits at about half its busbw."""
    points: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for r in records:
        s = r["spec"]
        if s.get("what") == "comm" and r["status"] == "ok" and s["collective"] != "all_to_all":
            m = r["metrics"]
            x = m["bytes"] * bus_factor(s["collective"], s["world_size"])
            points.setdefault((s["collective"], s["world_size"]), []).append(
                (x, m["time_ms"]["median"] / 1e3))
    fits = {}
    for key, pts in points.items():
        alpha, beta = _fit(pts)
        fits[key] = Link(intra_gbps=1 / beta / 1e9, base_us=alpha * 1e6, intra_hop_us=0.0)
    return fits


def _fit(pts: list[tuple[float, float]]) -> tuple[float, float]:
    """(alpha s, beta s/B) minimising sum ((alpha + beta x) / t - 1)^2, alpha >= 0."""
    a = [1 / t for _, t in pts]
    b = [x / t for x, t in pts]
    saa, sab, sbb = sum(v * v for v in a), sum(u * v for u, v in zip(a, b)), sum(v * v for v in b)
    det = saa * sbb - sab * sab
    if len(pts) >= 2 and det > 0:
        alpha = (sbb * sum(a) - sab * sum(b)) / det
        beta = (saa * sum(b) - sab * sum(a)) / det
        if alpha >= 0 and beta > 0:
            return alpha, beta
    if sbb == 0:
        raise ValueError("no message with bytes to fit a bandwidth to")
    return 0.0, sum(b) / sbb  # through the origin


def exposed_seconds(comm_s: float, compute_s: float, overlap: float,
                    last_s: float = 0.0) -> float:
    """Communication time a step waits for: max(last_s, comm_s - overlap x compute_s), at most
    comm_s: a collective issued asynchronously hides behind the `overlap` share of the compute
    that follows it, at full speed on both sides, its last piece (`last_s`) always exposed
    (the assumption, stated: docs/commands/plan.md, "How each number is made")."""
    if not 0 <= overlap <= 1:
        raise ValueError(f"overlap is a share of compute, 0..1: {overlap}")
    return min(comm_s, max(last_s, comm_s - overlap * compute_s))
