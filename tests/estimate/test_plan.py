"""The plan's search (`lmperf.estimate.plan`): one row per distinct plan, times cached by the
target's value, tensor parallelism priced as one rank runs it, MFU only against a known peak."""

from __future__ import annotations

import pytest

from lmperf.estimate import op_costs, plan
from lmperf.estimate.candidate import Candidate
from lmperf.estimate.fit import Workload, shape_of
from lmperf.estimate.layout import Layout
from lmperf.estimate.step_time import phases, step_time
from lmperf.estimate.target import cluster, gpu_targets
from lmperf.estimate.time_model import phase_times

TINY = Workload("tiny", "2026", None, 64, "sdpa", "cuda")


def _search(work: Workload, card, global_batch: int, checkpoints=(0, 1, 2, 4),
            precisions=("bf16-mixed", "bf16-fsdp"), progress=None, **space) -> list[dict]:
    rows, _ = plan.candidates(work, shape_of(work), card, global_batch,
                              plan.Space(tuple(precisions), tuple(checkpoints), **space), progress)
    return rows


def test_one_gpu_is_one_strategy_and_every_record_a_distinct_plan():
    # lmperf plan --size medium --gpu H100-SXM --gpus 1 --context 512 --global-batch 8 (issue 35)
    work = Workload("medium", "2026", None, 512, "sdpa", "cuda")
    rows = _search(work, cluster("H100-SXM", 1), 8)
    keys = [(r["precision"], r["checkpoint"], r["micro_batch"], r["compile"], r["float8"])
            for r in rows]
    assert len(keys) == len(set(keys)) and len(keys) > 4
    assert {r["strategy"] for r in rows} == {"single"} and {r["tp"] for r in rows} == {1}
    # FSDP's policy needs FSDP: one GPU's bf16 plan is bf16-mixed
    assert {r["precision"] for r in rows} == {"bf16-mixed"}


def test_progress_is_told_how_far_the_search_is():
    told = []
    rows = _search(TINY, cluster("H100-SXM", 2), 4, (0, 1), ("bf16-mixed",),
                   progress=lambda done, total, what: told.append((done, total, what)))
    assert rows and told and all(0 <= d <= t for d, t, _ in told)
    assert [d for d, _, _ in told] == sorted(d for d, _, _ in told)
    assert told[-1][0] == told[-1][1]  # it ends where it said it would
    assert any(w.startswith("simulating") for _, _, w in told)


def test_a_loop_over_targets_gets_each_targets_own_times():
    """The times are cached by the target's value, never by id(): a target made in a loop may
    reuse a collected one's id (issue 35: 150 of 300 calls got another target's times)."""
    costs = op_costs.count_op_costs(TINY.spec(1, "bf16-mixed"))
    for i in range(40):
        target = gpu_targets("H100-SXM", (1 + i % 2) * 10e-6)[0]  # dropped after each turn
        times, _ = phases(TINY, "bf16-mixed", 1, target)
        own = phase_times(costs, target)
        assert {p: times[p] for p in own} == {p: x.typical_s for p, x in own.items()}
    slow, fast = (phases(TINY, "bf16-mixed", 1, gpu_targets("H100-SXM", us * 1e-6)[0])[0]
                  for us in (20, 1))
    assert slow["forward"] > fast["forward"]


def test_tensor_and_sequence_parallelism_split_every_op_and_the_rank_issues_them_all():
    """One rank of t-way TP with sequence parallelism: every op's FLOPs and bytes at 1/t (the
    matmuls by width, the norms and residual adds by sequence), every op still issued by the
    rank's host; context parallelism: the step at T / cp, attention x cp."""
    work = Workload("small", "2026", None, 128, "sdpa", "cuda")
    card = gpu_targets("H100-SXM")[0]
    whole, flops = phases(work, "bf16-mixed", 2, card)
    half, half_flops = phases(work, "bf16-mixed", 2, card, 2)
    assert half_flops == pytest.approx(flops / 2, rel=1e-6)
    # more than half the time: the host issues every op on every rank (small at 128 tokens is
    # host-bound on an H100: a rank's forward, with loss parallelism's 4 ops more, can exceed
    # one device's)
    assert whole["forward"] / 2 < half["forward"] < 1.01 * whole["forward"]
    short = Workload("small", "2026", None, 64, "sdpa", "cuda")
    _, cp_flops = phases(short, "bf16-mixed", 2, card, 1, 2)
    _, short_flops = phases(short, "bf16-mixed", 2, card)
    assert short_flops < cp_flops < flops / 2 + 1  # T / 2 tokens, attention over all T


def test_a_width_tp_cannot_split_drops_that_degree_and_says_so():
    # tiny has 4 heads: 8-way TP cannot split them; 2 and 4 can
    rows, left = plan.candidates(TINY, shape_of(TINY), cluster("H100-SXM", 16), 16,
                                 plan.Space(("bf16-mixed",), (0,), pp=(1,)))
    assert {r["tp"] for r in rows if r["strategy"] == "fsdp"} == {1, 2, 4}
    assert "left out: tp 8: does not divide the model's 4 attention heads (2)" in \
        plan.left_out_lines(left)


def test_mfu_only_against_a_published_peak():
    # T4 has no bf16: a bf16-mixed plan has no MFU there, an fp32 plan has
    rows = _search(TINY, cluster("T4", 2), 4, (0,), ("bf16-mixed", "fp32"))
    assert all(r["mfu"] is None for r in rows if r["precision"] == "bf16-mixed")
    assert all(0 < r["mfu"] < 1 for r in rows if r["precision"] == "fp32")


@pytest.mark.slow
def test_a_cpu_plan_has_no_mfu():
    # a CPU's ceilings are measured, not a datasheet peak (issue 36: "MFU 91%" on a CPU)
    rows = _search(Workload("tiny", "2026", None, 64, "sdpa", "cpu", "foreach"),
                   cluster(None, 2, gib=1), 4, (0,), ("fp32",), strategies=("ddp", "fsdp"))
    assert rows and all(r["mfu"] is None for r in rows)


@pytest.mark.slow
def test_8b_on_8_h100_fsdp_beats_fsdp_x_tp4_as_torchtitan_measured():
    """torchtitan, Llama 3 8B on 8 H100 (pytorch/pytorch#88838, wanchaol, 2024-05-20): FSDP 8
    at 26.9% MFU against FSDP 2 x TP 4 at 22.4% (full activation checkpointing both)."""
    work = Workload("llama3-8b", "2026", None, 8192, "sdpa", "cuda")
    rows = _search(work, cluster("H100-SXM", 8), 16, (1,), tp=(1, 4), pp=(1,),
                   async_tp=(False,), strategies=("fsdp",))
    best = {}
    for r in rows:
        if r["fits"]:
            best.setdefault(r["tp"], r)
    assert best[1]["step_s"] < best[4]["step_s"]


def test_bf16_fsdp_steps_fp32_shards_as_fsdp2_does():
    """Under bf16-fsdp's policy FSDP2's optimizer steps fp32 shards: its time is fp32's, not
    that of bf16 states (half the bytes)."""
    work = Workload("small", "2026", None, 128, "sdpa", "cuda")
    shape, card = shape_of(work), cluster("H100-SXM", 2)
    bf16, fp32 = (step_time(Candidate(p, 0, "fsdp", Layout(2), 1, 1), work, shape, card, 2)
                  for p in ("bf16-fsdp", "fp32"))
    assert bf16["optimizer_s"] == pytest.approx(fp32["optimizer_s"])
    on_bf16_states = phases(work, "bf16-fsdp", 1, card.target)[0]["optimizer"] / 2
    assert on_bf16_states < 0.8 * bf16["optimizer_s"]  # memory-bound: the bytes count


def test_each_precision_is_timed_with_the_host_probed_on_its_own_ops(monkeypatch):
    """With the GPU at hand, autocast's host cost belongs to bf16-mixed only: the order of
    --precision changes no prediction."""
    from lmperf.estimate import host
    from lmperf.questions.plan.job import search
    from lmperf.questions.plan.spec import PlanSpec

    monkeypatch.setattr(host, "local_gpu", lambda name: True)
    monkeypatch.setattr(host, "_measured",
                        lambda spec: (40e-6 if spec.precision == "bf16-mixed" else 4e-6, 100))
    steps = []
    for order in (("bf16-mixed", "bf16-fsdp"), ("bf16-fsdp", "bf16-mixed")):
        rows, _, _, _ = search(PlanSpec("tiny", 64, 4, 2, gpu="H100-SXM", precisions=order,
                                        checkpoints=(0,)))
        steps.append({(r["precision"], r["strategy"], r["micro_batch"]): r["step_s"]
                      for r in rows})
    assert steps[0] == steps[1]


MINI_2048 = Workload("mini", "2026", None, 2048, "sdpa", "cpu", "fused")
LOGITS = 2048 * 10_000 * 4  # mini's (1, T, V) fp32 logits, bytes


def _cpu(fresh: float | None):
    from lmperf.estimate.time_model import Target

    return Target("cpu", {"fp32": 1e11}, 2e10, None, 1e-6, "measured", True, "measured", {},
                  fresh)


def test_a_cpu_pays_the_page_faults_of_each_fresh_output_above_glibcs_mmap_threshold():
    """Mini at 2048 tokens, b 1: the logits and log-softmax (forward), nll_loss's and
    log-softmax's gradients (backward) are 82 MB each, above 32 MiB; AdamW's 58 MB update is
    in place and the 4 MiB activations below: 2 outputs per phase at the fresh-write rate. A
    target without the rate (a GPU's caching allocator) pays none."""
    from lmperf.estimate.step_time import _counted
    from lmperf.estimate.time_model import op_times

    table = _counted(MINI_2048, "fp32", 1).table
    extra = op_times(table, _cpu(2e9))[2] - op_times(table, _cpu(None))[2]
    per_phase = {p: extra[(table["phase"] == p).to_numpy()].sum() for p in table["phase"].unique()}
    assert per_phase["forward"] == pytest.approx(2 * LOGITS / 2e9)
    assert per_phase["backward"] == pytest.approx(2 * LOGITS / 2e9)
    assert per_phase["optimizer"] == 0
    base, _ = phases(MINI_2048, "fp32", 1, _cpu(None))
    more, _ = phases(MINI_2048, "fp32", 1, _cpu(2e9))
    assert more["forward"] - base["forward"] == pytest.approx(per_phase["forward"])


def test_loss_parallelism_adds_its_passes_outputs_and_ops_over_the_rank_logits():
    """Under TP torch's loss_parallel decomposes log-softmax over a rank's (b, T, V / t)
    logits: 6 more passes, 2 more fresh outputs and 4 more ops in forward; 3, 2 and 5 in
    backward (torch/distributed/tensor/parallel/loss.py against aten's fused kernels)."""
    from lmperf.estimate.step_time import _counted, _unpriced

    table = _counted(MINI_2048, "fp32", 1).table  # its log-softmax writes L = LOGITS
    none = _unpriced(table, _cpu(None), 2)
    assert none["forward"] == pytest.approx(6 * LOGITS / 2e10 + 4e-6)
    assert none["backward"] == pytest.approx(3 * LOGITS / 2e10 + 5e-6)
    paged = _unpriced(table, _cpu(2e9), 2)
    assert paged["forward"] == pytest.approx(none["forward"] + 2 * LOGITS / 2e9)
    assert _unpriced(table, _cpu(2e9), 1) == {}


def test_a_pipeline_bubble_is_the_other_stages_work_not_the_slowest_ranks():
    """1F1B on 2 ranks: the last rank (2 blocks and the output) idles while the first (the
    embedding and 2 blocks) runs the first forward and the last backward: a bubble of one of
    the first rank's micro-batches, less than one of its own."""
    from lmperf.estimate.step_time import _micro

    shape = shape_of(MINI_2048)
    card = cluster("H100-SXM", 2)
    c = Candidate("fp32", 0, "single", Layout(2, pp=2, pp_schedule="1F1B"), 1, 1)
    first, last = _micro(c, MINI_2048, shape, card.target, 1)  # distinct: the 2 ranks differ
    assert sum(last[:3]) > sum(first[:3])
    assert step_time(c, MINI_2048, shape, card, 8)["bubble_s"] == pytest.approx(sum(first[:3]))


def test_pipeline_ranks_sharing_cores_lend_theirs_in_the_bubble():
    """Ranks beyond the cores (each priced at a share of one): a rank idling in its bubble gives
    its core to its neighbour, so 1F1B on 2 ranks sharing a core takes the two ranks' work over
    the one core (m x the mean rank's micro-batch, at the shared rate), less than the critical
    path at the shared rate and not less than that path at a whole core."""
    from dataclasses import replace

    from lmperf.estimate.step_time import _micro

    shape = shape_of(MINI_2048)
    card = cluster("H100-SXM", 2)
    c = Candidate("fp32", 0, "single", Layout(2, pp=2, pp_schedule="1F1B"), 1, 1)
    alone = step_time(c, MINI_2048, shape, card, 8)
    sharing = step_time(c, MINI_2048, shape, replace(card, share=0.5), 8)
    first, last = _micro(c, MINI_2048, shape, card.target, 1)
    work = sharing["compute_s"] + sharing["recompute_s"] + sharing["bubble_s"]
    assert sharing["bubble_s"] == 0 and min(sharing.values()) >= 0  # no part negative
    assert work == pytest.approx(8 * (sum(first[:3]) + sum(last[:3])) / 2)
    path = alone["compute_s"] + alone["recompute_s"] + alone["bubble_s"]
    assert path / 2 <= work < path


def test_loss_parallelism_is_priced_under_compile_too(monkeypatch):
    """torch.compile fuses the loss's rows into one; loss parallelism (which torchtitan runs
    eager, outside the compiled blocks) is priced on the table before."""
    from lmperf.estimate import step_time as st

    card = gpu_targets("H100-SXM")[0]
    work = Workload("small", "2026", None, 1024, "sdpa", "cuda")
    st.phases.cache_clear()
    priced, _ = st.phases(work, "bf16-mixed", 2, card, 2, compile=True)
    st.phases.cache_clear()
    monkeypatch.setattr(st, "_unpriced", lambda table, target, t: {})
    left_out, _ = st.phases(work, "bf16-mixed", 2, card, 2, compile=True)
    st.phases.cache_clear()
    assert priced["forward"] > left_out["forward"] and priced["backward"] > left_out["backward"]


def test_tp_over_every_gpu_of_a_node_is_searched_and_no_layout_twice():
    from collections import Counter

    work = Workload("llama3-8b", "2026", None, 8192, "sdpa", "cuda")
    found = plan.layouts(cluster("H100-SXM", 8), shape_of(work), 8192, 8,
                         plan.Space(("bf16-fsdp",), (1,)), Counter())
    assert len(found) == len(set(found))
    assert any(lay.tp == 8 for lay, _ in found)  # TP over all 8 GPUs of the node (issue 40)
    left = Counter()
    wide = plan.layouts(cluster("H100-SXM", 64), shape_of(work), 8192, 64,
                        plan.Space(("bf16-fsdp",), (1,)), left)
    assert all(lay.tp <= 8 for lay, _ in wide) and any("crosses nodes" in k[0] for k in left)
