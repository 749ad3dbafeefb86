"""`lmperf plan`: the search, its records, one answer to "fits", bad input, and --confirm."""

from __future__ import annotations

import json

import pytest

import lmperf
from lmperf.cli import main

FIELDS = ("precision", "checkpoint", "strategy", "dp_replicate", "dp_shard", "tp", "pp", "cp",
          "pp_schedule", "pp_virtual", "async_tp", "micro_batch", "grad_accum")
METRICS = ("peak_gib", "fits", "step_s", "tokens_per_s_per_gpu", "mfu")


@pytest.fixture(scope="module")
def small_on_h100():
    return lmperf.plan("small", gpu="H100-SXM", gpus=8, context=1024, global_batch=16,
                       checkpoint=[0, 1])


def test_every_candidate_is_a_plan_record_with_the_issue_fields(small_on_h100):
    records = small_on_h100.records
    assert records and all(r["kind"] == "plan" and r["status"] == "ok" for r in records)
    for r in records:
        assert all(k in r["spec"] for k in FIELDS)
        assert all(k in r["metrics"] for k in METRICS)
        assert r["metrics"]["method"].startswith("PREDICTED")
        if not r["metrics"]["fits"]:
            assert r["metrics"]["why"].startswith("does not fit")
    ranks = [r["metrics"]["rank"] for r in records]
    assert ranks == sorted(ranks)
    # fitting first, fastest first; losers say why they lost
    fitting = [r["metrics"] for r in records if r["metrics"]["fits"]]
    assert [m["step_s"] for m in fitting] == sorted(m["step_s"] for m in fitting)
    assert all("the winner's step" in m["why"] for m in fitting[1:])
    # every micro-batch accumulates to the global batch over its data-parallel replicas
    for r in records:
        s = r["spec"]
        assert s["dp_replicate"] * s["dp_shard"] * s["tp"] * s["pp"] * s["cp"] == 8
        per_replica = 16 // (s["dp_replicate"] * s["dp_shard"])
        if s["pp"] > 1:  # the pipeline's micro-batches split the rank's batch evenly
            assert s["grad_accum"] == 1 and per_replica % s["micro_batch"] == 0
        else:
            assert s["micro_batch"] * (s["grad_accum"] - 1) < per_replica <= \
                s["micro_batch"] * s["grad_accum"]
    assert small_on_h100.headline[0].startswith("winner:")
    winner = records[0]["spec"]
    # lmperf runs the eager data-parallel winners; a bf16 layout (TP, PP) or a compiled or
    # float8 one runs on torchtitan
    plain = winner["tp"] == winner["pp"] == 1 and not winner["compile"] and \
        winner["float8"] == "none"
    runs = "lmperf dist train --world-size 8 " if plain else \
        "PYTHONPATH=DIR torchrun --nnodes=1 --nproc_per_node=8 -m torchtitan.train"
    assert small_on_h100.headline[1].startswith(f"run it: `{runs}")
    assert len({r["spec"]["search"] for r in records}) == 1


def test_mfu_counts_model_flops_on_bench_s_convention(small_on_h100):
    """MFU = the global step's model FLOPs (causal attention over half the square, as bench
    counts them) / (GPUs x peak x step): the same for every candidate of one search, and not
    the ops as a rank runs them (sdpa's counter counts the full square; TP's ranks split it)."""
    from lmperf.estimate.target import cluster
    from lmperf.measure.flops import analytic_flops
    from lmperf.workload.spec import RunSpec

    c = RunSpec.from_size("small")
    per_seq = analytic_flops(c.d_model, c.num_layers, c.d_ff, c.vocab_size, 1, 1024,
                             "train-step", causal=True).total
    peaks = cluster("H100-SXM", 8).target.flops_per_s
    for r in small_on_h100.records:
        m, s = r["metrics"], r["spec"]
        rate = peaks["fp32" if s["precision"] == "fp32" else "bf16"]
        assert m["mfu"] * 8 * rate * m["step_s"] == pytest.approx(per_seq * 16, rel=1e-9)


def test_smaller_micro_batches_are_evaluated_below_the_largest_that_fits(small_on_h100):
    by_config: dict = {}
    for r in small_on_h100.records:
        s = r["spec"]
        by_config.setdefault(tuple(s[k] for k in FIELDS[:-2]), []).append(
            (s["micro_batch"], r["metrics"]["largest_micro_batch"]))
    assert any(len(v) > 1 for v in by_config.values())
    for v in by_config.values():
        largest = v[0][1]
        assert all(b <= (largest or 1) for b, _ in v)


def test_json_is_one_record_per_candidate(capsys, tmp_path):
    code = main(["plan", "--size", "tiny", "--gpu", "A100-80GB", "--gpus", "2", "--context", "64",
                 "--global-batch", "4", "--checkpoint", "0", "--precision", "bf16-mixed",
                 "--json", "-", "--out", str(tmp_path / "plan.jsonl")])
    assert code == 0
    records = json.loads(capsys.readouterr().out)
    assert len(records) == len((tmp_path / "plan.jsonl").read_text().splitlines())
    assert {r["spec"]["strategy"] for r in records} >= {"ddp", "zero1", "zero2", "fsdp"}


@pytest.mark.parametrize("argv, said", [
    (["--device", "cpu", "--gpus", "2"], "--gib"),
    (["--gpu", "NoSuchGPU"], "NoSuchGPU"),
    (["--gpu", "H100-SXM", "--gpus", "3", "--global-batch", "4"],
     "dp 3: data-parallel degree does not divide global batch 4"),
    (["--gpu", "H100-SXM", "--precision", "fp8"], "plan precision"),
    (["--gpu", "H100-SXM", "--host-us", "-1"], "--host-us"),
    (["--gpu", "H100-SXM", "--confirm", "2"], "GPU at hand"),
    (["--gpu", "H100-SXM", "--top", "0"], "--top must be a positive integer"),
    (["--gpu", "H100-SXM", "--top", "-1"], "--top must be a positive integer"),
    (["--gpu", "H100-SXM", "--precision", "bf16-fsdp"], "plan bf16-mixed"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, said):
    assert main(["plan", "--size", "tiny", "--context", "64", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("lmperf: error:") and said in err[-1]
    assert not any("Traceback" in line for line in err)


@pytest.mark.slow
def test_confirm_runs_planned_cells_on_gloo_ranks_and_scores_them():
    report = lmperf.plan("tiny", device="cpu", gpus=2, gib=0.06, context=128, global_batch=8,
                         precision="fp32", checkpoint=0, confirm=2, timeout=300)
    cells = [r for r in report.records if r["spec"].get("confirm") and r["spec"]["cell"] != "summary"]
    assert len(cells) == 4 and all(r["status"] == "ok" for r in cells)
    for r in cells:
        m = r["metrics"]
        assert m["measured_peak_bytes"] > 0 and m["planned_fits"] == (
            m["planned_peak_bytes"] <= m["budget_bytes"])
        # torch's DDP and FSDP2, as the plan models them: within 0.01% here
        assert abs(m["peak_error"]) <= 0.01
    summary = report.records[-1]["metrics"]
    assert summary["cells"] == 4 and summary["boundary_correct"] == 1.0
    assert any(f.startswith("confirmed on 4 cells") for f in report.findings)


def test_a_summary_without_pairs_or_cells_says_n_a():
    from lmperf.questions.plan.job import score
    from lmperf.questions.plan.report import build_report
    from lmperf.results.schema import make_record

    from lmperf.questions.plan.spec import PlanSpec

    plan = PlanSpec(size="tiny", context=64, global_batch=4, gpus=2, gpu="H100-SXM").to_dict()
    summary = make_record("plan", {**plan, "confirm": True, "cell": "summary", "search": "s"},
                          "ok", {}, metrics=score([]))
    assert score([])["kendall_tau"] is None and score([])["winner_vs_best"] is None
    assert any("Kendall tau of step times n/a" in f for f in build_report([summary]).findings)
    # a cell whose second timing round failed says so (pool_rounds put it in its warnings)
    cell = make_record("plan", {**plan, "confirm": True, "cell": "rank1-b1", "search": "s"},
                       "ok", {}, metrics={}, warnings=["round 1: error: boom"])
    assert "rank1-b1: round 1: error: boom; its step is from the rounds that ran" in \
        build_report([cell, summary]).findings


@pytest.mark.slow
def test_confirm_on_one_device_runs_each_cell_as_a_job_of_its_own():
    """--gpus 1 --confirm K: the path the GPU at hand takes (issue 34), on the CPU: single-process
    cells forked as any job, no torchrun, scored as the ranks' are, the winner held to the best."""
    report = lmperf.plan("tiny", device="cpu", gpus=1, gib=0.05, context=128, global_batch=8,
                         precision="fp32", checkpoint=[0, 1], confirm=2, timeout=300)
    cells = [r for r in report.records if r["spec"].get("confirm") and r["spec"]["cell"] != "summary"]
    assert len(cells) == 4 and all(r["status"] == "ok" for r in cells)
    for r in cells:
        assert r["spec"]["strategy"] == "single" and "backend" not in r["env"]  # no process group
        assert r["job_id"] and abs(r["metrics"]["peak_error"]) <= 0.05
    summary = report.records[-1]["metrics"]
    assert summary["cells"] == 4 and summary["boundary_correct"] == 1.0
    assert summary["winner_vs_best"] >= 1.0 and summary["winner_step_s"] > 0
    assert any("the predicted winner's measured step / the best of them" in f
               for f in report.findings)
    # issue 43, item 7: the time model's miss, with the load it was measured under
    ratio, load = summary["step_ratio"], summary["load_average_1m"]
    assert ratio > 0 and load is not None
    assert any(f"step measured / predicted {ratio:.2f}x (median; load {load:.1f})" in f
               for f in report.findings)


def test_confirm_takes_any_name_of_the_gpu_at_hand(monkeypatch):
    """--gpu H100 or h100-sxm on an "NVIDIA H100 80GB HBM3" is the GPU at hand: --confirm runs."""
    from lmperf.questions.plan import job
    from lmperf.runtime import device as dev

    monkeypatch.setattr(dev, "cuda_available", lambda: True)
    monkeypatch.setattr(dev, "device_name", lambda device: "NVIDIA H100 80GB HBM3")
    ran = []
    monkeypatch.setattr(job, "confirm", lambda spec, rows, k, *a: ran.append(spec.gpu) or [])
    for name in ("H100", "h100-sxm"):
        lmperf.plan("tiny", gpu=name, gpus=1, context=64, global_batch=2, checkpoint=0,
                    precision="bf16-mixed", host_us=5.0, confirm=1)
    assert ran == ["H100", "h100-sxm"]


@pytest.mark.slow
def test_every_reason_a_search_left_candidates_out_is_one_line(capsys, tmp_path):
    """Issue 40: nothing dropped without a word (8B at 131,072 tokens, global batch 2)."""
    assert main(["plan", "--size", "llama3-8b", "--gpu", "H100-SXM", "--gpus", "8", "--context",
                 "131072", "--global-batch", "2", "--precision", "bf16-fsdp", "--checkpoint",
                 "1", "--out", str(tmp_path / "p.jsonl")]) == 0
    text = capsys.readouterr().out
    (record,) = [r for r in map(json.loads, (tmp_path / "p.jsonl").read_text().splitlines())
                 if r["metrics"]["rank"] == 1]
    reasons = {key.split("|")[0] for key in record["metrics"]["left_out"]}
    said = [line for line in text.replace("\n  ", " ").splitlines() if "left out:" in line]
    assert reasons and len(said) == len(reasons)
    assert all(any(why in line for line in said) for why in reasons)
    assert any("dp 8, dp 4: data-parallel degree does not divide global batch 2" in line
               for line in said)


def test_confirm_spreads_its_plans_and_never_picks_a_predicted_tie(monkeypatch):
    """The 4-rank confirm of 2026-12-07 picked 1F1B and interleaved 1F1B predicted 0.1% apart
    (twice): a pair the model calls a tie, ranked by the machine's noise. A plan within 2% of
    one picked is taken only when nothing else is left."""
    from lmperf.questions.plan import job

    monkeypatch.setattr(job, "runner_of", lambda row, spec: "layout")
    steps = [3.457, 3.461, 3.471, 3.482, 3.55, 4.287, 4.291, 4.297, 4.341, 4.382]
    rows = [{"rank": i + 1, "step_s": s, "fits": True, "tp": 2 if s > 4 else 1,
             "pp": 2 if i in (0, 1, 5, 6) else 1} for i, s in enumerate(steps)]
    picked = [r["step_s"] for r in job._picks(None, rows, 4)]
    assert picked == [3.457, 3.55, 4.287, 4.382]
    assert len(job._picks(None, rows, 10)) == 10  # all of them when K asks for all
    # K 6: nothing is left 2% from the four picks: the least tied plans (0.9%, then 0.7% from
    # the nearest pick), not the ones nearest the goals (0.1% from a pick)
    assert [r["step_s"] for r in job._picks(None, rows, 6)] == [
        3.457, 3.482, 3.55, 4.287, 4.341, 4.382]
    # the fastest TP plan is TP x PP 1F1B; its interleaved twin (0.1% away) is the fastest
    # other PP plan: the PP pick takes the next PP plan apart from it instead
    twins = [{"rank": 1, "step_s": 3.0, "fits": True, "tp": 2, "pp": 2},
             {"rank": 2, "step_s": 3.003, "fits": True, "tp": 2, "pp": 2},
             {"rank": 3, "step_s": 3.5, "fits": True, "tp": 1, "pp": 2},
             {"rank": 4, "step_s": 4.0, "fits": True, "tp": 1, "pp": 1}]
    assert [r["rank"] for r in job._picks(None, twins, 3)] == [1, 3, 4]


def test_separated_tau_ranks_only_the_pairs_planned_more_than_2_percent_apart():
    """The 4-rank confirm of 2026-12-07 (second run): 6 plans, two pairs swapped, each planned
    within 2% (1F1B and interleaved 1F1B 0.1% apart; TP x PP and FSDP x TP 1.7%): tau-a 0.73
    over all 15 pairs; over the 11 pairs planned more than 2% apart, all in order."""
    from lmperf.questions.plan.job import kendall_tau, separated_tau

    planned = [3.334, 3.427, 4.107, 4.111, 4.177, 4.202]
    measured = [3.835, 4.721, 5.986, 5.754, 5.930, 6.056]
    assert kendall_tau(planned, measured) == pytest.approx(11 / 15)
    assert separated_tau(planned, measured) == 1.0
    assert separated_tau([1.0, 1.01], [2.0, 1.0]) is None  # one pair, a tie
    assert separated_tau([1.0, 2.0, 4.0], [3.0, 2.0, 5.0]) == pytest.approx(1 / 3)
