"""`dist train`'s layouts (issue 42): TP with sequence and loss parallelism, PP (GPipe, 1F1B,
interleaved 1F1B), HSDP, FSDP x TP and FSDP x PP on gloo CPU ranks, each checked against one
process (the first step's loss and gradients, the parameters after the run), its collectives
per rank and mesh dimension held to the byte against their derivation from the model's
shapes, its per-rank peak of live bytes recorded; what dist train cannot run refused in one
line before anything launches. The 4-rank layouts run in ONE torchrun launch (six items)."""

from __future__ import annotations

import pytest

from lmperf.core.torchrun import run_job
from lmperf.errors import SpecError
from lmperf.estimate.layout import Layout
from lmperf.questions.parallel.api import dist
from lmperf.questions.parallel.items import Item, parse
from lmperf.questions.parallel.pipeline import idle_slots
from lmperf.questions.parallel.plan import plan_dist
from lmperf.questions.parallel.report import build_report, headline
from lmperf.questions.parallel.spec import TrainJob

# the mini preset (4 blocks), at a short context: every figure below is derived from these
C, L, H, F, V, T, B = 128, 4, 4, 512, 10_000, 32, 4  # B: sequences per data-parallel replica
SHAPE = dict(size="mini", d_model=C, num_layers=L, num_heads=H, d_ff=F, vocab_size=V, context=T,
             batch=B, warmup=0, steps=1, profile_steps=1)
BLOCK = 4 * C * C + 3 * C * F + 2 * C  # a block's parameters: q, k, v, o, w1, w2, w3, 2 norms
PP = "pp_schedule={} micro_batch=1"
FOUR = {"none tp=4": "tp 4", "fsdp2 tp=2": "shard 2 x tp 2",
        f"none pp=4 {PP.format('1F1B')}": "pp 4 (1F1B)",
        f"none pp=4 {PP.format('GPipe')}": "pp 4 (GPipe)",
        f"fsdp2 pp=2 {PP.format('1F1B')}": "shard 2 x pp 2 (1F1B)",
        "fsdp2 dp_replicate=2": "replicate 2 x shard 2"}


def test_an_item_names_its_strategy_and_layout_once() -> None:
    item = parse("fsdp2 pp=2 pp_schedule=interleaved1f1b pp_virtual=2 micro_batch=2", 4)
    assert item.layout == Layout(4, pp=2, pp_schedule="Interleaved1F1B", pp_virtual=2)
    assert item.key() == "fsdp2 pp=2 pp_schedule=Interleaved1F1B pp_virtual=2 micro_batch=2"
    assert parse(item.key(), 4) == item
    assert item.spec_fields()["layout"] == "shard 2 x pp 2 (Interleaved1F1B v2)"
    assert item.spec_fields()["dp_shard"] == 2 and item.spec_fields()["micro_batch"] == 2
    plain = parse("torch-ddp", 4)  # plain data parallelism: the record keeps its identity
    assert not plain.is_layout and plain.key() == "torch-ddp" and plain.spec_fields() == {}


def test_a_layout_gets_its_strategy_and_its_ranks() -> None:
    def keys(**kw) -> list[tuple[int, tuple[str, ...]]]:
        plan = plan_dist("train", size="mini", device="cpu", **kw)
        return [(j.world_size, j.strategies) for j in plan.jobs]

    assert keys(tp=4) == [(4, ("none tp=4",))]  # the layout's ranks; one replica: no strategy
    assert keys(world_size=4, tp=2) == [(4, ("fsdp2 tp=2",))]  # two replicas: fsdp2
    assert keys(world_size=4, dp_replicate=2, strategy="fsdp2") == [(4, ("fsdp2 dp_replicate=2",))]
    assert keys(world_size=2, pp=2, pp_schedule="Interleaved1F1B") == [
        (2, ("none pp=2 pp_schedule=Interleaved1F1B pp_virtual=2 micro_batch=1",))]
    # a sweep runs what it can and says what it skipped
    plan = plan_dist("train", world_size=4, tp=[1, 2, 4], pp=[1, 2], strategy="fsdp2",
                     size="mini", device="cpu")
    assert plan.jobs[0].strategies == ("fsdp2", f"fsdp2 pp=2 {PP.format('1F1B')}", "fsdp2 tp=2",
                                       f"none tp=2 pp=2 {PP.format('1F1B')}", "none tp=4")
    assert any("tp 4 x pp 2" in note for note in plan.notes)


@pytest.mark.parametrize("kw, words", [
    (dict(world_size=4, tp=2, strategy="naive"), "its strategy is fsdp2"),
    (dict(world_size=4, cp=2), "CUDA attention kernels only"),
    (dict(world_size=4, tp=3), "does not divide 4"),
    (dict(world_size=8, tp=8), "does not divide the model's 4 attention heads"),
    (dict(world_size=4, pp=4, micro_batch=2), "torch refuses the schedule"),
    (dict(world_size=4, pp=4, grad_accum=2), "--grad-accum 2"),
    (dict(world_size=2, pp=2, checkpoint=1), "--checkpoint with --pp"),
    (dict(world_size=4, tp=2, compute_dtype="bf16"), "--compute-dtype bf16"),
])
def test_what_dist_train_cannot_run_is_refused_before_anything_launches(kw, words) -> None:
    with pytest.raises(SpecError, match=words):
        plan_dist("train", size="mini", device="cpu", **kw)


@pytest.mark.parametrize("schedule, p, m, v", [("GPipe", 4, 4, 1), ("1F1B", 4, 4, 1),
                                                ("1F1B", 4, 8, 1), ("Interleaved1F1B", 2, 4, 2),
                                                ("Interleaved1F1B", 4, 8, 2)])
def test_idle_slots_replay_torchs_action_lists_as_the_textbook_counts_them(schedule, p, m,
                                                                          v) -> None:
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    counted = idle_slots(dict(enumerate(get_schedule_ops(schedule, p, m, v))), p * v)
    # every rank idles 2 (p - 1) slots of a stage's forward or backward: (p - 1)(f + b) / v of
    # its own per-micro-batch work, as Layout.bubble prices it (f = b = v slots)
    lay = Layout(p, pp=p, pp_schedule=schedule, pp_virtual=v)
    assert counted["idle"] == [2 * (p - 1)] * p == [lay.bubble(m, v, v)] * p
    assert counted["busy"] == [2 * m * v] * p and counted["slots"] == 2 * m * v + 2 * (p - 1)


def test_the_headline_answers_first() -> None:
    record = {"kind": "dist", "status": "ok", "spec": {
        "what": "train", "strategy": "none", "layout": "pp 4 (1F1B)", "world_size": 4},
        "metrics": {"step_ms": {"median": 180.0}, "tokens_per_s": 1426.0,
                    "correctness": {"equal": True}, "peak_live_bytes": [3e7, 1e7, 5e6, 4.1e7],
                    "pipeline": {"idle_slots": [6, 6, 6, 6], "slots": 14,
                                 "formula_idle_slots": 6}}}
    assert headline([record]) == [
        "pp 4 (1F1B) on 4 ranks: 180.0 ms/step, 1,426 tokens/s, matches one process; each rank "
        "idles 6 of 14 slots (formula 6); live peak 39.1 MiB (fullest rank)"]


def _expected(layout: str) -> dict[tuple[str, str], int]:
    """The bytes (S) each rank sends per step, by (collective, mesh dimension), fp32, derived
    from the shapes (docs/commands/dist.md, "Layouts"): TP all-gathers and reduce-scatters a
    sequence-split activation (B, T, C) 4L + 2 times each; loss parallelism all-reduces 3 (B T)
    columns (max, sum of exp, the target's logit); the RMSNorm weights' partial gradients are
    all-reduced where used: 3 times each in AdamW's foreach step under TP alone, once under FSDP
    x TP. FSDP2 gathers each block twice (forward, backward) and the root once (its parameters
    stay for backward), or everything once under PP (reshard_after_forward False), and
    reduce-scatters each unit once; HSDP all-reduces the reduce-scattered shard across the
    replicas. A pipeline stage sends each micro-batch's activation (1, T, C) forward and its
    gradient back."""
    act, norms, root = B * T * C * 4, (2 * L + 1) * C * 4, 2 * V * C + C
    tp = lambda lazy: {("all_gather", "tp"): (4 * L + 2) * act,  # noqa: E731
                       ("reduce_scatter", "tp"): (4 * L + 2) * act,
                       ("all_reduce", "tp"): 3 * B * T * 4 + lazy * norms}
    p2p = T * C * 4 * B  # a micro-batch of 1 sequence, B micro-batches
    if layout == "tp 4":
        return tp(3)
    if layout == "shard 2 x tp 2":  # a rank's TP halves, the norms whole
        block, top = (BLOCK - 2 * C) // 2 + 2 * C, V * C + C
        return {**tp(1), ("all_gather", "dp_shard"): (2 * L * block + top) * 4,
                ("reduce_scatter", "dp_shard"): (L * block + top) * 4}
    if layout.startswith("pp 4"):
        return {("send", "pp"): p2p, ("recv", "pp"): p2p}  # the ends; the middle ranks twice
    if layout == "shard 2 x pp 2 (1F1B)":  # stage 0: 2 blocks + the embedding
        stage = (2 * BLOCK + V * C) * 4
        return {("all_gather", "dp_shard"): stage, ("reduce_scatter", "dp_shard"): stage,
                ("send", "pp"): p2p, ("recv", "pp"): p2p}
    assert layout == "replicate 2 x shard 2"
    return {("all_gather", "dp_shard"): (2 * L * BLOCK + root) * 4,
            ("reduce_scatter", "dp_shard"): (L * BLOCK + root) * 4,
            ("all_reduce", "dp_replicate"): (L * BLOCK + root) * 4 // 2}


@pytest.fixture(scope="module")
def four() -> list[dict]:
    """The six 4-rank layouts of the issue's acceptance, in one launch."""
    return run_job(TrainJob(world_size=4, strategies=tuple(FOUR), **SHAPE))


def _rows(record: dict, rank: int) -> dict[tuple[str, str], int]:
    return {(r["collective"], r["dim"]): r["bytes"]
            for r in record["metrics"]["collectives"]["per_rank"][rank]}


@pytest.mark.slow
def test_four_rank_layouts_train_as_one_process_does(four: list[dict]) -> None:
    assert [r["spec"]["layout"] for r in four] == list(FOUR.values())
    for r in four:
        assert r["status"] == "ok", r.get("message")
        check = r["metrics"]["correctness"]
        assert check["equal"] is True, (r["spec"]["layout"], check)
        assert check["gradients"]["equal"] and check["gradients"]["max_abs_diff"] < 1e-7
        assert check["loss"]["equal"] and check["loss"]["abs_diff"] < 1e-5
        assert "global batch" in check["reference"] and "gradients" in check["reference"]


@pytest.mark.slow
def test_each_layouts_collectives_are_its_derived_bytes(four: list[dict]) -> None:
    for r in four:
        layout = r["spec"]["layout"]
        assert _rows(r, 0) == _expected(layout), layout
        # the ledger saw every collective the backend ran (gloo: a reduce-scatter is an all-reduce)
        for rows, calls in zip(r["metrics"]["collectives"]["per_rank"],
                               r["metrics"]["collectives"]["profiler_calls"]):
            ran: dict[str, int] = {}
            for row in rows:
                op = "all_reduce" if row["collective"] == "reduce_scatter" else row["collective"]
                ran[op] = ran.get(op, 0) + row["calls"]
            assert ran == calls, layout
    pp4 = next(r for r in four if r["spec"]["layout"] == "pp 4 (1F1B)")
    assert pp4["metrics"]["collective_bytes"]["send"] == [T * C * 4 * B * k for k in (1, 2, 2, 1)]
    last = next(r for r in four if r["spec"]["layout"] == "shard 2 x pp 2 (1F1B)")
    assert _rows(last, 3)[("all_gather", "dp_shard")] == (2 * BLOCK + V * C + C) * 4  # + norm


@pytest.mark.slow
def test_each_rank_has_its_peak_and_a_pipeline_its_idle_slots(four: list[dict]) -> None:
    for r in four:
        peaks, held = r["metrics"]["peak_live_bytes"], r["metrics"]["memory"]["per_rank"]
        assert len(peaks) == 4 and all(p > h["parameters_bytes"] + h["optimizer_bytes"]
                                       for p, h in zip(peaks, held))
    by = {r["spec"]["layout"]: r["metrics"] for r in four}
    for layout in ("pp 4 (1F1B)", "pp 4 (GPipe)"):
        pipe = by[layout]["pipeline"]
        assert pipe["idle_slots"] == [6] * 4 and pipe["slots"] == 14  # 2 (p - 1) of 2 m + 2 (p - 1)
        assert pipe["blocks_per_stage"] == [1, 2, 1, 0]  # torchtitan's split of 4 blocks + 2
    # the head's logits (B, T, V) live on the last stage only
    assert max(by["pp 4 (1F1B)"]["peak_live_bytes"][1:3]) < by["pp 4 (1F1B)"]["peak_live_bytes"][3]
    text = build_report(four).render("text")
    assert "6 of 6 runs checked match one process" in text.splitlines()[0]
    assert "collectives per step" in text and "pipeline slots" in text


@pytest.mark.slow
def test_interleaved_1f1b_on_two_ranks() -> None:
    report = dist("train", world_size=2, pp=2, pp_schedule="Interleaved1F1B", pp_virtual=2,
                  **{k: v for k, v in SHAPE.items() if k not in ("d_model", "num_layers",
                                                                 "num_heads", "d_ff")})
    [r] = report.records
    assert r["status"] == "ok", r.get("message")
    assert r["spec"]["layout"] == "pp 2 (Interleaved1F1B v2)"
    assert r["metrics"]["correctness"]["equal"] is True
    # each rank sends 3 boundaries' worth: rank 0 stage 0 -> 1 and 2 -> 3 forward, 2 -> 1 back
    assert r["metrics"]["collective_bytes"]["send"] == [3 * T * C * 4 * B] * 2
    pipe = r["metrics"]["pipeline"]
    assert pipe["idle_slots"] == [2, 2] and pipe["formula_idle_slots"] == 2
    assert report.headline[0].startswith("pp 2 (Interleaved1F1B v2) on 2 ranks: ")
    assert "matches one process" in report.headline[0]


def test_items_check_the_strategy_of_a_layout() -> None:
    with pytest.raises(SpecError, match="no --strategy"):
        TrainJob(world_size=4, strategies=("fsdp2 tp=4",), **SHAPE)
    Item("none", Layout(4, tp=4))  # frozen, comparable
