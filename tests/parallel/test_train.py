"""`lmperf dist train` end to end: every strategy on a tiny LM, world sizes 1 and 2 (two launches)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import lmperf.questions.parallel
from lmperf.core.kinds import build_reports
from lmperf.questions.parallel.spec import STRATEGIES
from lmperf.results.store import read_records


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    folder = tmp_path_factory.mktemp("dist")
    report = lmperf.dist("train", world_size=[1, 2], size="tiny", vocab_size=256, context=16,
                         batch=2, warmup=1, steps=2, profile_steps=1, bucket_mb=0.1,
                         out=folder / "dist.jsonl", plots=folder / "plots")
    return report, folder


def test_every_strategy_ran_and_matches_single_process(run: tuple) -> None:
    report, _ = run
    df = report.frame
    assert sorted(df["strategy"]) == sorted(STRATEGIES)
    assert (df["status"] == "ok").all(), df[["strategy", "message"]]
    assert df["matches_single"].all(), df[["strategy", "max_abs_diff"]]
    assert set(df.loc[df["strategy"] == "single", "world_size"]) == {1}
    assert set(df.loc[df["strategy"] != "single", "world_size"]) == {2}
    for r in report.records:  # the record says how the equality was judged
        check = r["metrics"]["correctness"]
        n = r["spec"]["world_size"]
        assert check["equal"] and check["atol"] > 0 and f"global batch {n} x 2" in check["reference"]


def test_bytes_counted_match_the_analytic_volume(run: tuple) -> None:
    report, _ = run
    for r in report.records:
        strategy, b = r["spec"]["strategy"], r["metrics"]["bytes"]
        if strategy == "single":
            assert b["analytic_bus_bytes"] == 0 and r["metrics"]["comm"]["comm_ms"] == 0
            continue
        # counted from the profiler's gloo events; predicted with gloo's reduce_scatter costed
        # as the all-reduce it runs
        assert b["counted_bus_bytes"] == pytest.approx(b["analytic_backend_bus_bytes"], rel=1e-6), strategy
    by = {r["spec"]["strategy"]: r["metrics"]["bytes"] for r in report.records}
    params = by["naive"]["param_elements"]["total"]
    assert by["naive"]["analytic_bus_bytes"] == pytest.approx(2 * (2 - 1) / 2 * 4 * params)
    # zero1: the all-reduce's 2 (n-1)/n x 4P plus every parameter broadcast once (4P)
    assert by["zero1"]["analytic_bus_bytes"] == pytest.approx(4 * params + 4 * params)


def test_memory_is_counted_per_rank(run: tuple) -> None:
    report, _ = run
    df = report.frame.set_index("strategy")
    full = df.loc["naive"]
    assert df.loc["single", "params_mib"] == pytest.approx(full["params_mib"])
    assert full["optimizer_mib"] == pytest.approx(2 * full["params_mib"], rel=1e-3)  # AdamW m, v
    # fsdp2: parameters, gradients and state split over 2 ranks
    assert df.loc["fsdp2", "params_mib"] == pytest.approx(full["params_mib"] / 2, rel=0.01)
    assert df.loc["fsdp2", "optimizer_mib"] == pytest.approx(full["optimizer_mib"] / 2, rel=0.01)
    for zero in ("zero1", "torch-zero1"):  # only the optimizer state is split
        assert df.loc[zero, "params_mib"] == pytest.approx(full["params_mib"])
        assert df.loc[zero, "optimizer_mib"] < 0.75 * full["optimizer_mib"]
    assert (df["peak_mib"] > 0).all()


def test_times_overhead_and_accounting(run: tuple) -> None:
    report, _ = run
    df = report.frame
    for r in df.itertuples():
        assert r.step_ms > 0 and r.tokens_per_s > 0
        assert r.overlap_ms <= r.comm_ms + 1e-9 and r.exposed_ms == pytest.approx(r.comm_ms - r.overlap_ms)
        if r.strategy == "single":
            assert r.dp_overhead_ms == 0
        else:
            assert not math.isnan(r.dp_overhead_ms) and r.comm_ms > 0
    assert any("match single-process training" in f for f in report.findings)
    assert "fsdp2" in report.render("markdown")


def test_results_file_table_and_plots(run: tuple) -> None:
    report, folder = run
    records = read_records(folder / "dist.jsonl")
    assert len(records) == len(STRATEGIES)
    assert {r["env"]["world_size"] for r in records} == {1, 2} and records[0]["env"]["backend"] == "gloo"
    [rebuilt] = build_reports(records)  # what `lmperf table` prints
    assert list(rebuilt.frame["strategy"]) == list(report.frame["strategy"])
    assert (folder / "plots" / "dist-train.png").stat().st_size > 10_000


def test_resume_skips_finished_items(run: tuple) -> None:
    _, folder = run
    before = (folder / "dist.jsonl").read_text()
    again = lmperf.dist("train", world_size=[1, 2], size="tiny", vocab_size=256, context=16,
                        batch=2, warmup=1, steps=2, profile_steps=1, bucket_mb=0.1,
                        out=folder / "dist.jsonl", resume=True)
    assert (folder / "dist.jsonl").read_text() == before  # nothing launched, nothing appended
    assert again.records and all(r["status"] == "ok" for r in again.records)  # the whole sweep
