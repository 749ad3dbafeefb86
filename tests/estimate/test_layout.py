"""The layout, named once (issue 40): degrees validated once, torchtitan's stage split, what a
pipeline rank holds in flight and how long it idles under each schedule."""

from __future__ import annotations

import pytest

from lmperf.errors import SpecError
from lmperf.estimate.layout import Layout, schedule_name

LLAMA_405B = dict(num_layers=126, num_heads=128, num_kv_heads=8)


def test_the_shard_degree_is_what_the_other_degrees_leave():
    lay = Layout(512, tp=8, pp=8, pp_schedule="1f1b")
    assert (lay.dp_shard, lay.dp, lay.pp_schedule, lay.stages) == (8, 8, "1F1B", 8)
    assert lay.fields() == {"dp_replicate": 1, "dp_shard": 8, "tp": 8, "pp": 8, "cp": 1,
                            "pp_schedule": "1F1B", "pp_virtual": 1, "async_tp": False}
    assert Layout(8, pp_schedule="GPipe", pp_virtual=1).pp_schedule is None  # no pipeline
    hsdp = Layout(16, dp_replicate=2)
    assert (hsdp.dp_replicate, hsdp.dp_shard, hsdp.dp) == (2, 8, 16)


@pytest.mark.parametrize("kwargs, words", [
    (dict(gpus=8, tp=3), "does not divide 8 GPUs"),
    (dict(gpus=8, pp=2, pp_schedule="Interleaved1F1B"), "--pp-virtual 2 or more"),
    (dict(gpus=8, pp=2, pp_schedule="1F1B", pp_virtual=2), "one stage per rank"),
    (dict(gpus=8, pp=2, pp_schedule="ZBVZeroBubble", pp_virtual=4), "exactly 2 stages"),
    (dict(gpus=8, pp=2, pp_schedule="zigzag"), "unknown pipeline schedule 'zigzag'"),
    (dict(gpus=0), "--gpus must be a positive integer"),
])
def test_a_layout_that_cannot_exist_is_refused_in_one_line(kwargs, words):
    with pytest.raises(SpecError, match=words):
        Layout(**kwargs)


@pytest.mark.parametrize("layout, ask, words", [
    (Layout(256, tp=16), dict(context=8192, global_batch=16), "8 K/V heads"),
    (Layout(8, tp=8), dict(context=8188, global_batch=16), "does not divide context"),
    (Layout(8, cp=8), dict(context=8200, global_batch=8), "2 cp chunks"),
    (Layout(8), dict(context=8192, global_batch=12), "dp 8 data-parallel degree does not divide"),
    (Layout(8, pp=8, pp_schedule="Interleaved1F1B", pp_virtual=32),
     dict(context=8192, global_batch=8), "stages per rank exceed the model's 126 blocks"),
    (Layout(16, pp=2), dict(context=8192, global_batch=16, micro_batch=3), "rank's batch 2"),
])
def test_what_a_model_and_a_batch_must_satisfy(layout, ask, words):
    with pytest.raises(SpecError, match=words):
        layout.check(**LLAMA_405B, **ask)


def test_stages_split_as_torchtitan_splits_them():
    """torchtitan 0.3's _generate_llm_fqn_per_model_part (input and output weight 1), run on
    405B's 126 blocks over 16 stages and on 80 blocks over 8: the embedding and the output each
    take a layer's place on the first and last stage."""
    lay = Layout(512, tp=8, pp=8, pp_schedule="Interleaved1F1B", pp_virtual=2)
    assert [s.layers for s in lay.split(126)] == [7] + [8] * 14 + [7]
    assert [s.layers for s in Layout(64, pp=8).split(80)] == [10, 11, 10, 10, 10, 10, 10, 9]
    stages = lay.split(126)
    assert stages[0].embedding and not stages[0].head and stages[-1].head
    assert sum(s.layers for s in stages) == 126
    assert lay.rank_stages(0) == (0, 8) and lay.rank_stages(7) == (7, 15)
    v = Layout(16, pp=4, pp_schedule="ZBVZeroBubble", pp_virtual=2)
    assert v.rank_stages(0) == (0, 7) and v.rank_stages(3) == (3, 4)


def test_what_a_pipeline_rank_holds_in_flight():
    one = Layout(8, pp=8, pp_schedule="1F1B")
    assert [one.in_flight(r, 8) for r in (0, 7)] == [8, 1]
    assert Layout(8, pp=8, pp_schedule="GPipe").in_flight(7, 8) == 8
    inter = Layout(8, pp=8, pp_schedule="Interleaved1F1B", pp_virtual=2)
    # torch's warm-up: (v - 1) p + 2 (p - 1 - r), plus the forward whose backward runs next
    assert [inter.in_flight(r, 16) for r in (0, 7)] == [8 + 14 + 1, 8 + 1]
    assert inter.in_flight(0, 8) == 16  # never more than m v


def test_the_bubble_of_each_schedule():
    f, b = 1.0, 2.0
    assert Layout(8, pp=8, pp_schedule="1F1B").bubble(8, f, b) == 7 * 3
    assert Layout(8, pp=8, pp_schedule="Interleaved1F1B", pp_virtual=2).bubble(8, f, b) == 7 * 3 / 2
    # the weight gradients (half the backward by default) fill the cool-down
    assert Layout(8, pp=8, pp_schedule="InterleavedZeroBubble", pp_virtual=2).bubble(8, f, b) == 3.5
    assert Layout(8, pp=8, pp_schedule="ZBVZeroBubble", pp_virtual=2).bubble(8, f, b) == 0
    assert Layout(8).bubble(8, f, b) == 0


def test_fewer_micro_batches_than_stages_wait_for_one_micro_batchs_path():
    """A schedule's steady-state bubble assumes m >= p: one micro-batch through 2 ranks of
    ZB-V takes its whole forward and input-gradient path, 2 (f + b - w) + w, on the clock."""
    f, b = 1.0, 2.0
    zbv = Layout(2, pp=2, pp_schedule="ZBVZeroBubble", pp_virtual=2)
    assert zbv.bubble(1, f, b) == 2 * (3 - 1) + 1 - 3 and zbv.bubble(4, f, b) == 0
    inter = Layout(4, pp=4, pp_schedule="Interleaved1F1B", pp_virtual=2)
    assert inter.bubble(1, f, b) == 3 * 3 and inter.bubble(4, f, b) == 3 * 3 / 2
    with pytest.raises(SpecError, match="2 micro-batches: torch refuses the schedule"):
        Layout(4, pp=4, pp_schedule="1F1B").check(num_layers=8, num_heads=4, num_kv_heads=None,
                                                  context=64, global_batch=4, micro_batch=2)


def test_micro_batches_and_accumulation():
    assert Layout(8).micro_batches(16, 1) == [1, 1] and Layout(8).grad_accum(16, 1) == 2
    assert Layout(4).micro_batches(12, 2) == [2, 1]  # the last one smaller
    piped = Layout(512, tp=8, pp=8)
    assert piped.micro_batches(256, 4) == [4] * 8 and piped.grad_accum(256, 4) == 1


def test_schedule_names_are_torchs_whatever_the_case():
    assert schedule_name("interleaved1f1b") == "Interleaved1F1B"
