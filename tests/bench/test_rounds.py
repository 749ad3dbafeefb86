"""Pooling the rounds of a spec: wall and CPU samples alike, each with its round."""

from __future__ import annotations


import pytest

from lmperf.measure.stats import summarize
from lmperf.questions.bench.rounds import pool_rounds


def _round(k: int, wall: list[float], cpu: list[float]) -> dict:
    metrics = {f"{p}_ms": None for p in ("backward", "optimizer")}
    metrics |= {"forward_ms": summarize(wall), "step_ms": summarize(wall), "tokens_per_step": 64,
                "flops_per_step": None, "peak_tflops": None,
                "cpu_time": {"clock": "thread_time", "covers": "the measuring thread",
                             "forward_ms": summarize(cpu), "step_ms": summarize(cpu),
                             "backward_ms": None, "optimizer_ms": None}}
    return {"kind": "bench", "status": "ok", "spec": {}, "job_id": f"abc-r{k}", "round": k,
            "metrics": metrics}


def test_cpu_times_are_pooled_by_round_like_wall_times():
    (pooled,) = pool_rounds([_round(0, [10.0, 12.0], [9.0, 9.5]), _round(1, [30.0, 31.0], [9.2, 9.4])])
    assert pooled["rounds"] == 2 and pooled["job_id"] == "abc" and "round" not in pooled
    wall, cpu = pooled["metrics"]["step_ms"], pooled["metrics"]["cpu_time"]["step_ms"]
    assert wall["samples"] == [10.0, 12.0, 30.0, 31.0] and wall["sample_round"] == [0, 0, 1, 1]
    assert cpu["samples"] == [9.0, 9.5, 9.2, 9.4] and cpu["sample_round"] == [0, 0, 1, 1]
    assert cpu["round_medians"] == [9.25, 9.3]
    assert cpu["round_spread"] == pytest.approx(0.05 / 9.3)
    assert pooled["metrics"]["cpu_time"]["backward_ms"] is None
    assert pooled["metrics"]["tokens_per_s"] == pytest.approx(64 / (wall["median"] / 1e3))
