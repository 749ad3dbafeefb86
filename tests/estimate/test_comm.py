"""lmperf.estimate.comm: NCCL's ring / tree formulas by hand, the fit, the overlap rule."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from lmperf.estimate.comm import (BACKWARD_SHARE, Link, collective_seconds, exposed_seconds,
                                  fit_from_records)

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "dist_comm_gloo" / "comm.jsonl"
NVLINK = Link(450.0)                        # one NVLink domain (H100 SXM per direction)
CLUSTER = Link(450.0, inter_gbps=50.0)      # 8 per node, 50 GB/s network per GPU


def test_ring_by_hand_inside_a_node() -> None:
    # all_reduce, 8 GPUs, 1e9 B: 8.4 + 14 x 3.4 = 56 us; 2 x 7/8 x 1e9 / 450e9 s
    assert collective_seconds("all_reduce", 1e9, 8, NVLINK, "ring") == pytest.approx(
        56e-6 + 1.75e9 / 450e9)
    # all_gather: 7 steps, (n-1)/n; broadcast: 7 steps, factor 1
    assert collective_seconds("all_gather", 1e9, 8, NVLINK) == pytest.approx(
        (8.4 + 7 * 3.4) * 1e-6 + 0.875e9 / 450e9)
    assert collective_seconds("broadcast", 1e9, 8, NVLINK) == pytest.approx(
        (8.4 + 7 * 3.4) * 1e-6 + 1e9 / 450e9)


def test_spanning_nodes_takes_the_network_and_its_hops() -> None:
    # 16 GPUs on 2 nodes: 30 steps, 2 of them across the network, at 50 GB/s
    ring = collective_seconds("all_reduce", 1e9, 16, CLUSTER, "ring")
    assert ring == pytest.approx((8.4 + 28 * 3.4 + 2 * 14) * 1e-6 + 2 * 15 / 16 * 1e9 / 50e9)
    # 8 GPUs fit in one node: NVLink, even though the Link has a network
    assert collective_seconds("all_reduce", 1e9, 8, CLUSTER) == collective_seconds(
        "all_reduce", 1e9, 8, NVLINK)


def test_tree_by_hand_and_auto_picks_the_faster() -> None:
    # 64 GPUs on 8 nodes, 1 MB: tree 8.4 + 2 (7 x 3.4 + 3 x 14) us + 2e6 / (0.92 x 50e9)
    tree = collective_seconds("all_reduce", 1e6, 64, CLUSTER, "tree")
    ring = collective_seconds("all_reduce", 1e6, 64, CLUSTER, "ring")
    assert tree == pytest.approx(140e-6 + 2e6 / 46e9)
    assert ring == pytest.approx(585.2e-6 + 2 * 63 / 64 * 1e6 / 50e9)
    assert collective_seconds("all_reduce", 1e6, 64, CLUSTER) == tree < ring
    # large messages: the ring's 2 (n-1)/n beats the tree's 2 / 0.92
    big = [collective_seconds("all_reduce", 1e10, 64, CLUSTER, a) for a in ("ring", "tree")]
    assert collective_seconds("all_reduce", 1e10, 64, CLUSTER) == min(big) == big[0]
    # one node: same hops, less bandwidth, the tree never wins
    assert collective_seconds("all_reduce", 1e3, 8, NVLINK) == collective_seconds(
        "all_reduce", 1e3, 8, NVLINK, "ring")


def test_one_device_costs_nothing_and_bad_names_raise() -> None:
    assert collective_seconds("all_reduce", 1e9, 1, CLUSTER) == 0.0
    with pytest.raises(ValueError):
        collective_seconds("all_gather", 1e6, 8, NVLINK, "tree")
    with pytest.raises(ValueError):
        collective_seconds("gather", 1e6, 8, NVLINK)
    with pytest.raises(ValueError):
        collective_seconds("all_reduce", 1e6, 8, NVLINK, "nvls")


def _record(collective: str, n: int, size: int, ms: float) -> dict:
    return {"status": "ok", "spec": {"what": "comm", "collective": collective, "world_size": n},
            "metrics": {"bytes": size, "time_ms": {"median": ms}}}


def test_fit_recovers_alpha_and_bandwidth_from_the_formula() -> None:
    truth = Link(2.5, base_us=300.0, intra_hop_us=0.0)
    sizes = [2**k for k in range(10, 27, 2)]
    records = [_record(c, n, s, collective_seconds(c, s, n, truth, "ring") * 1e3)
               for c in ("all_reduce", "broadcast") for n in (2, 4) for s in sizes]
    fits = fit_from_records(records)
    assert set(fits) == {(c, n) for c in ("all_reduce", "broadcast") for n in (2, 4)}
    for link in fits.values():
        assert link.base_us == pytest.approx(300.0, rel=1e-6)
        assert link.intra_gbps == pytest.approx(2.5, rel=1e-6)
    # the fitted Link predicts through the same formula
    assert collective_seconds("all_reduce", 3e6, 4, fits[("all_reduce", 4)], "ring") == \
        pytest.approx(collective_seconds("all_reduce", 3e6, 4, truth, "ring"))


def test_fit_never_gives_a_negative_latency() -> None:
    # times proportional to size but the smallest a little fast: alpha would be < 0
    records = [_record("all_gather", 2, s, s / 2 / 1e9 * 1e3 * f)
               for s, f in ((1024, 0.5), (2**20, 1.0), (2**24, 1.0))]
    link = fit_from_records(records)[("all_gather", 2)]
    assert link.base_us == 0.0 and link.intra_gbps > 0


def test_fit_on_real_dist_comm_records() -> None:
    records = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    fits = fit_from_records(records)
    assert set(fits) == {(c, n) for c in ("all_reduce", "all_gather", "reduce_scatter",
                                          "broadcast") for n in (2, 4)}
    errors = []
    for r in records:
        s, m = r["spec"], r["metrics"]
        link = fits[(s["collective"], s["world_size"])]
        assert link.base_us >= 0 and 0.01 < link.intra_gbps < 100  # a CPU, not NVLink
        t = collective_seconds(s["collective"], m["bytes"], s["world_size"], link, "ring") * 1e3
        errors.append(abs(t - m["time_ms"]["median"]) / m["time_ms"]["median"])
    assert statistics.median(errors) < 0.35  # in-sample, a noisy 2-core VM (measured 0.18)
    # gloo's reduce_scatter is an all-reduce of the whole array: about half all_gather's W
    for n in (2, 4):
        ratio = fits[("reduce_scatter", n)].intra_gbps / fits[("all_gather", n)].intra_gbps
        assert 0.3 < ratio < 0.8


def test_exposed_seconds() -> None:
    # blocking: everything exposed; overlapped: what backward cannot hide, at least the last bucket
    assert exposed_seconds(0.010, 0.030, 0.0) == 0.010
    assert exposed_seconds(0.030, 0.030, BACKWARD_SHARE) == pytest.approx(0.010)
    assert exposed_seconds(0.010, 0.030, BACKWARD_SHARE, last_s=0.002) == 0.002
    assert exposed_seconds(0.001, 0.030, 1.0, last_s=0.005) == 0.001  # never above comm
    with pytest.raises(ValueError):
        exposed_seconds(0.01, 0.03, 1.5)
