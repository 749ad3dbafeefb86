"""The plan against torchtitan's published Llama 3 runs (issues 40 and 41): each run evaluated
as one configuration on its GPU entry (tests/data/published/torchtitan_llama3_h100.csv): T1-T7's
tokens/s within 20% at the median and none beyond 1.4x, their peaks within 20% of the reserved
memory at the median, every layout fits; bf16 < + compile < + compile + float8 with each gain,
and async TP's and interleaved 1F1B's, within half and twice the published; the plain bf16 run
within 20%; searched freely, 405B on 512 GPUs has a pipeline among its three best layouts and
8B at 131,072 tokens searches context parallelism and fits."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from lmperf.estimate import plan
from lmperf.estimate.communication import layout_prediction
from lmperf.estimate.fit import Workload, shape_of
from lmperf.estimate.target import cluster


def _script():
    spec = importlib.util.spec_from_file_location(
        "check_plan_published", Path(__file__).resolve().parents[2] / "scripts"
        / "check_plan_published.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SCRIPT = _script()
facts, predicted = SCRIPT.facts, SCRIPT.predicted


T1_T7 = ["T1", "T2", "T3", "T4a", "T4b", "T4c", "T5a", "T5b", "T6a", "T6b", "T7a", "T7b", "T7c"]


@pytest.mark.slow
def test_t1_to_t7_within_20_percent_at_the_median_and_none_beyond_1_4x():
    """Issue 41: tokens/s per GPU and the per-rank peak (with its allowance) against torchtitan's
    max reserved memory (docs/accuracy.md: 13% and -7% on 2026-12-07)."""
    import statistics

    speed = [predicted(r)["tokens_per_s_per_gpu"] / float(facts()[r]["tokens_per_s"])
             for r in T1_T7]
    memory = [predicted(r)["peak_gib"] / float(facts()[r]["memory_gib"]) for r in T1_T7]
    assert statistics.median(abs(x - 1) for x in speed) <= 0.2
    assert all(1 / 1.4 <= x <= 1.4 for x in speed), speed
    assert abs(statistics.median(memory) - 1) <= 0.2, memory


@pytest.mark.slow
@pytest.mark.parametrize("base, plus", [("T1", "T2"), ("T2", "T3"), ("T4a", "T4b"),
                                        ("T4b", "T4c")])
def test_compile_then_float8_gain_within_half_and_twice_the_published(base, plus):
    """bf16 < + compile < + compile + float8, each gain within half and twice torchtitan's."""
    published = float(facts()[plus]["tokens_per_s"]) / float(facts()[base]["tokens_per_s"])
    gain = predicted(plus)["tokens_per_s_per_gpu"] / predicted(base)["tokens_per_s_per_gpu"]
    assert 1 + (published - 1) / 2 <= gain <= 1 + 2 * (published - 1)


@pytest.mark.slow
@pytest.mark.parametrize("run", T1_T7)
def test_each_published_layout_fits_its_gpu(run):
    row = predicted(run)
    assert row["fits"], row.get("why")
    assert row["dp_shard"] == int(facts()[run]["dp_shard"])


@pytest.mark.slow
@pytest.mark.parametrize("slow, fast", [
    ("T5a", "T5b"), ("T6a", "T6b")])
def test_async_tp_and_interleaving_gain_within_half_and_twice_the_published(slow, fast):
    published = float(facts()[fast]["tokens_per_s"]) / float(facts()[slow]["tokens_per_s"])
    gain = predicted(fast)["tokens_per_s_per_gpu"] / predicted(slow)["tokens_per_s_per_gpu"]
    assert 1 + (published - 1) / 2 <= gain <= 1 + 2 * (published - 1)


@pytest.mark.slow
def test_plain_bf16_fsdp_70b_on_64_a100_within_20_percent():
    assert predicted("T8c")["tokens_per_s_per_gpu"] / 331 == pytest.approx(1, abs=0.2)


@pytest.mark.slow
def test_405b_on_512_gpus_has_a_pipeline_among_its_three_best_layouts():
    from lmperf.questions.plan.report import layout_name

    work = Workload("llama3-405b", "2026", None, 8192, "sdpa", "cuda", "fused")
    rows, _ = plan.candidates(work, shape_of(work), cluster("H100-96GB", 512), 256,
                              plan.Space(("bf16-fsdp",), (1,)))
    best = list(dict.fromkeys(layout_name(r) for r in rows if r["fits"]))[:3]
    assert any(" pp" in f" {name}" for name in best), best


@pytest.mark.slow
def test_8b_at_131072_tokens_searches_context_parallelism_and_fits():
    work = Workload("llama3-8b", "2026", None, 131072, "sdpa", "cuda", "fused")
    rows, left = plan.candidates(work, shape_of(work), cluster("H100-96GB", 8), 2,
                                 plan.Space(("bf16-fsdp",), (1,)))
    assert any(r["cp"] > 1 for r in rows) and rows[0]["fits"]
    lines = plan.left_out_lines(left)
    assert "left out: dp 8, dp 4: data-parallel degree does not divide global batch 2 (12)" in lines


# `lmperf dist train`'s collectives per step and rank (its ledger: tests/parallel/
# test_layouts.py), mini at T 32, fp32, on 4 gloo ranks: the plan's bytes for the same layouts
MEASURED = {  # (layout, global batch, b) -> per pipeline rank {(mesh dimension, op): bytes}
    ("tp4", 4, 4): [{("tp", "all_gather"): 1_179_648, ("tp", "reduce_scatter"): 1_179_648}],
    ("fsdp2 x tp2", 8, 4): [{("dp_shard", "all_gather"): 9_323_008,
                             ("dp_shard", "reduce_scatter"): 7_221_760,
                             ("tp", "all_gather"): 1_179_648, ("tp", "reduce_scatter"): 1_179_648,
                             ("tp", "all_reduce"): 6_144}],
    ("pp4", 4, 1): [{("pp", "send"): x} for x in (65_536, 131_072, 131_072, 65_536)],
    ("fsdp2 x pp2", 8, 1): [{("dp_shard", "all_gather"): x, ("dp_shard", "reduce_scatter"): x,
                             ("pp", "send"): 65_536} for x in (7_219_200, 7_219_712)],
    ("hsdp 2x2", 16, 4): [{("dp_shard", "all_gather"): 18_637_312,
                           ("dp_shard", "reduce_scatter"): 14_438_912,
                           ("dp_replicate", "all_reduce"): 7_219_456}],
}


@pytest.mark.parametrize("name, global_batch, b", list(MEASURED))
def test_the_plans_collective_bytes_are_dist_trains(name, global_batch, b):
    """Issue 42: each layout's bytes per step equal the ledger's, per rank and mesh dimension
    (tp 4's all-reduces aside: torch 2.13 reduces the replicated norms' gradients 3 times under
    TP alone, the plan once: docs/accuracy.md)."""
    from lmperf.estimate.candidate import Candidate
    from lmperf.estimate.layout import Layout

    layout = {"tp4": Layout(4, tp=4), "fsdp2 x tp2": Layout(4, tp=2),
              "pp4": Layout(4, pp=4, pp_schedule="1F1B"),
              "fsdp2 x pp2": Layout(4, pp=2, pp_schedule="1F1B"),
              "hsdp 2x2": Layout(4, dp_replicate=2)}[name]
    c = Candidate("fp32", 0, "fsdp" if layout.dp > 1 else "single", layout, b, 1)
    work = Workload("mini", "2026", None, 32, "sdpa", "cpu", "foreach")
    ranks = layout_prediction(work, c, cluster(None, 4, gib=1), global_batch)
    for planned, measured in zip(ranks, MEASURED[name, global_batch, b]):
        assert {k: planned["collective_bytes"][k] for k in measured} == measured
