"""`lmperf dist comm` end to end: torchrun, 2 gloo ranks, the acceptance's sizes."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from lmperf.cli import main
from lmperf.estimate.formulas import bus_factor
from lmperf.results.store import read_records

SIZES = {"1KiB": 1024, "1MiB": 2**20, "16MiB": 16 * 2**20}


def test_comm_records_follow_the_formulas(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "dist.jsonl"
    code = main(["dist", "comm", "--world-size", "2", "--sizes", *SIZES, "--iters", "3",
                 "--warmup", "1", "--out", str(out), "--no-plots"])
    assert code == 0
    records = read_records(out)
    assert len(records) == 5 * 3 and all(r["status"] == "ok" for r in records)
    for r in records:
        spec, m = r["spec"], r["metrics"]
        assert spec["world_size"] == 2 and spec["size_bytes"] in SIZES.values()
        assert m["bytes"] == spec["size_bytes"]  # these sizes divide evenly by 2 x 4 bytes
        per_rank = m["per_rank_ms"]
        assert len(per_rank) == 2 and all(len(times) == 3 for times in per_rank)
        slowest = [max(col) for col in zip(*per_rank)]  # per iteration, the last rank to finish
        assert m["time_ms"]["samples"] == pytest.approx(slowest)
        assert m["spread_ms"]["samples"] == pytest.approx([max(c) - min(c) for c in zip(*per_rank)])
        algbw = m["bytes"] / (statistics.median(slowest) / 1e3) / 1e9
        assert m["algbw_gbps"] == pytest.approx(algbw)
        assert m["busbw_gbps"] == pytest.approx(algbw * bus_factor(spec["collective"], 2))
        assert m["comparable"] == (spec["collective"] != "reduce_scatter")  # gloo's emulation
    text = capsys.readouterr().out
    assert "busbw (GB/s) by message size" in text and "reduce_scatter" in text
