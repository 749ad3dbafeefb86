"""`lmperf plan --confirm` with layouts (issue 42): TP and PP plans picked beside the
data-parallel ones, run on `dist train`'s layout builder on gloo ranks, and scored per rank
(peak against the pipeline rank's plan, collective bytes per mesh dimension)."""

from __future__ import annotations

import pytest

import lmperf
from lmperf.questions.plan.job import runner_of, score
from lmperf.questions.plan.spec import PlanSpec

SPEC = PlanSpec(size="mini", context=32, global_batch=8, gpus=4, device="cpu", gib=0.03,
                precisions=("fp32",), checkpoints=(0,))


def _row(**kw) -> dict:
    row = dict(precision="fp32", checkpoint=0, strategy="single", dp_replicate=1, dp_shard=1,
               tp=1, pp=1, cp=1, pp_schedule=None, pp_virtual=1, async_tp=False,
               micro_batch=4, grad_accum=1, compile=False, float8="none")
    return {**row, **kw}


def test_what_confirm_runs_here_and_how():
    assert runner_of(_row(strategy="fsdp", dp_shard=4, micro_batch=2), SPEC) == "engine"
    assert runner_of(_row(strategy="fsdp", dp_shard=2, tp=2), SPEC) == "layout"
    assert runner_of(_row(strategy="fsdp", dp_replicate=2, dp_shard=2, micro_batch=2),
                     SPEC) == "layout"  # HSDP
    assert runner_of(_row(tp=2, pp=2, pp_schedule="1F1B"), SPEC) == "layout"
    for why in (dict(tp=4, async_tp=True), dict(tp=2, pp=2, pp_schedule="ZBVZeroBubble",
                                                pp_virtual=2),
                dict(tp=2, pp=2, pp_schedule="1F1B", checkpoint=1),
                dict(tp=2, pp=2, pp_schedule="1F1B", checkpoint="full"),
                dict(pp=4, pp_schedule="1F1B", micro_batch=4)):
        assert runner_of(_row(**why), SPEC) is None, why  # the last: 2 micro-batches, 4 stages


def test_score_holds_each_rank_to_its_own_plan():
    def cell(tp, pp, errors, moved, planned, measured, fits=(True, True)):
        return {"spec": {"tp": tp, "pp": pp},
                "metrics": {"rank_peak_errors": errors, "peak_error": max(errors, key=abs),
                            "collective_bytes_errors": moved, "planned_fits": fits[0],
                            "measured_fits": fits[1], "planned_step_s": planned,
                            "measured_step_s": measured}}

    s = score([cell(2, 1, [0.01, 0.01], [{"tp": 0.0, "dp_shard": -0.002}] * 2, 1.0, 2.0),
               cell(1, 2, [0.03, -0.05], [{"pp": 0.0}, {"pp": 0.0, "tp": None}], 2.0, 3.0),
               cell(1, 1, [0.0], [{}], None, None, fits=(False, True))])
    assert s["cells"] == 3 and s["tp_cells"] == 1 and s["pp_cells"] == 1
    assert s["peak_error"] == 0.05 and s["peak_error_median"] == 0.01  # of 5 ranks
    assert s["collective_bytes_error"] == 0.002 and s["collective_bytes_error_median"] == 0.0
    assert s["boundary_correct"] == pytest.approx(2 / 3) and s["kendall_tau"] == 1.0
    assert s["winner_vs_best"] == 1.0
    assert s["step_ratio"] == pytest.approx(1.75) and s["load_average_1m"] is None  # 2x, 1.5x


@pytest.mark.slow
def test_confirm_runs_tp_and_pp_plans_on_dist_trains_layouts():
    """mini at context 32 on 4 ranks, 30.7 MiB each: the fastest TP plan (FSDP x TP 2 x 2, b 4),
    the fastest PP plan that runs here (TP x PP, interleaved 1F1B) and the fastest of the rest
    (TP x PP 1F1B), each at b and b + 1, in one torchrun launch (~25 s)."""
    report = lmperf.plan("mini", device="cpu", gpus=4, gib=0.03, context=32, global_batch=8,
                         precision="fp32", checkpoint=0, confirm=3, tp=[1, 2], pp=[1, 2],
                         timeout=300)
    cells = [r for r in report.records
             if r["spec"].get("confirm") and r["spec"]["cell"] != "summary"]
    assert len(cells) == 6 and all(r["status"] == "ok" for r in cells), cells
    assert any(r["spec"]["tp"] > 1 and r["spec"]["pp"] == 1 for r in cells)
    assert any(r["spec"]["pp"] > 1 for r in cells)
    assert all(r["spec"]["runner"] == "layout" for r in cells if r["spec"]["tp"] > 1)
    for r in cells:
        m = r["metrics"]
        assert len(m["measured_rank_peak_bytes"]) == 4
        # each rank against its pipeline rank's plan: within 2% without a pipeline, 5% with
        # one (measured: +3.7% on interleaved's output ranks, the rest within 0.9%; FSDP x TP
        # -0.3%, and -1.7% in 1 of 4 runs beside another test worker: 0.5 MB more alive on
        # one rank, not identified, as the readable FSDP's gloo buffers are at times)
        limit = 0.05 if r["spec"]["pp"] > 1 else 0.02
        assert all(abs(e) <= limit for e in m["rank_peak_errors"]), (r["spec"]["cell"], m)
        for rank in m["collective_bytes_errors"]:  # per mesh dimension, every op's S summed
            assert all(abs(e) <= 0.01 for e in rank.values() if e is not None), rank
    assert not all(r["metrics"]["measured_fits"] for r in cells)  # some b + 1 do not fit
    summary = report.records[-1]["metrics"]
    assert summary["boundary_correct"] == 1.0 and summary["tp_cells"] >= 2
    assert summary["peak_error"] <= 0.05 and summary["peak_error_median"] <= 0.01
    assert any("per-rank peak error median" in f for f in report.findings)


def test_a_boundary_cell_out_of_memory_in_its_first_step_does_not_fit(monkeypatch):
    """On one GPU the b + 1 cell may run out of memory in its first (untracked) step: that is
    its answer, 'does not fit' (peak None), not an error."""
    import json
    from types import SimpleNamespace

    import torch

    from lmperf.questions.parallel import train
    from lmperf.questions.plan import confirm
    from lmperf.runtime import device as dev

    cell = {"cell": "rank1-b2", "runner": "engine", "strategy": "single", "precision": "fp32",
            "checkpoint": "none", "sizes": [2], "timed": False}
    plan = {"size": "tiny", "course": "2026", "model": None, "context": 16, "attention": "sdpa"}
    job = SimpleNamespace(cell=lambda item: cell, plan=json.dumps(plan), seed=0, world_size=1,
                          steps=1)

    def out_of_memory(*args):
        raise RuntimeError("out of memory (a stand-in)")

    monkeypatch.setattr(train, "train_step", out_of_memory)
    monkeypatch.setattr(dev, "is_oom", lambda exc: "out of memory" in str(exc))
    got = confirm.measure(job, "rank1-b2", torch.device("cpu"))
    assert got["peak_bytes"] is None and got["collective_bytes"] == {}
    cell["timed"] = True  # a timed cell must fit: its failure is an error
    with pytest.raises(RuntimeError):
        confirm.measure(job, "rank1-b2", torch.device("cpu"))


def test_later_rounds_time_the_plans_again_in_reverse_and_pool_into_the_first():
    import json

    from lmperf.questions.plan.job import pool_rounds
    from lmperf.questions.plan.spec import ConfirmJob

    cells = [{"cell": name, "timed": timed} for name, timed in
             (("a-b1", True), ("a-b2", False), ("b-b1", True), ("c-b1", True))]
    job = ConfirmJob(world_size=2, plan="{}", device="cpu", cells=json.dumps(cells), rounds=3)
    # the memory-only cell first: it warms the ranks before any cell is timed
    assert job.items() == ["a-b2", "a-b1", "b-b1", "c-b1", "c-b1@1", "b-b1@1", "a-b1@1",
                           "a-b1@2", "b-b1@2", "c-b1@2"]
    assert job.cell("b-b1@2")["round"] == 2 and job.cell("b-b1")["round"] == 0

    def rec(steps, status="ok"):  # two ranks' timed steps; the slowest rank's per step
        ranks = [{"step_s": list(steps)}, {"step_s": [s - 0.5 for s in steps]}]
        return {"status": status, "message": "boom", "metrics": {
            "ranks": ranks, "measured_step_s": sorted(steps)[len(steps) // 2]}}

    done = [{"status": "ok", "metrics": {}}, rec([4.0, 4.2]), rec([5.0, 5.2]), rec([6.0, 6.0]),
            rec([6.4, 6.2]), rec([3.0, 3.2]), rec([4.4, 4.6]),
            rec([4.0, 4.0]), rec([0, 0], "error"), rec([6.0, 6.0])]
    pooled = pool_rounds(job.items(), done, [c["cell"] for c in cells])
    assert len(pooled) == 4 and pooled[1] is done[0]  # in the cells' order
    a, b = pooled[0]["metrics"], pooled[2]["metrics"]
    assert a["step_samples_s"] == [4.0, 4.2, 4.4, 4.6, 4.0, 4.0] and a["measured_step_s"] == 4.1
    assert a["round_step_s"] == [4.2, 4.6, 4.0]
    assert b["measured_step_s"] == 4.1  # 3.0, 3.2, 5.0, 5.2: round 2 failed, said below
    assert pooled[2]["warnings"] == ["round 2: error: boom"]
