"""Every strategy equals single-process training on the global batch (2 gloo ranks, one launch).

The toy model has a frozen parameter and tied weights; fp32 for every strategy, and fsdp2 with
bf16 and fp16 compute against a single-process run that mirrors its casts. Each item also
checks the course's interface: rank 0's weights broadcast at construction, gradients shaped and
typed as their parameters after finish_gradient_synchronization(), ShardedOptimizer's
add_param_group after construction (zero1), gather_full_params (fsdp2).
"""

from __future__ import annotations

import pytest

from lmperf.core.torchrun import run_job
from tests.parallel.jobs import StrategyCheck

FP32 = ["naive", "flat", "overlap", "bucketed", "torch-ddp", "fsdp2", "zero1", "torch-zero1"]
CHECKS = [f"{s}:fp32" for s in FP32] + [f"fsdp2:{d}" for d in ("bf16", "fp16")]


@pytest.fixture(scope="module")
def records() -> dict[str, dict]:
    out = run_job(StrategyCheck(world_size=2, checks=tuple(CHECKS)))
    return {r["spec"]["check"]: r for r in out}


@pytest.mark.parametrize("check", CHECKS)
def test_strategy_matches_single_process(records: dict[str, dict], check: str) -> None:
    record = records[check]
    assert record["status"] == "ok", (record["message"], record.get("log_tail"))
    for rank, r in enumerate(record["metrics"]["ranks"]):
        assert r["broadcast"], f"rank {rank} did not start from rank 0's weights"
        assert r["tied"] and r["frozen"] and r["grads"]
        assert r["compared"] == 8 and not r["missing"]  # tied weights are one parameter
        assert r["equal"], f"rank {rank}: max diff {r['max_abs_diff']} in {r['worst']}"
