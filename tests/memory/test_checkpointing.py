"""Activation checkpointing: same numbers, the expected saved-bytes factor, the trade-off table."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lmperf.workload.spec import RunSpec
from lmperf.errors import SpecError
from lmperf.questions.memory.checkpointing import check_groups, sweep_checkpointing, tradeoff_frame
from lmperf.estimate.checkpoint_plan import set_checkpointing
from lmperf.questions.memory.saved import measure_saved
from lmperf.model import TransformerLM
from tests.memory.handcount import BTC, B, C, F as D_FF, H, T, V, batch, hand_count_block

LAYERS = 4


def model(group: int = 0) -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(V, 16, C, LAYERS, H, D_FF, checkpoint_group=group)


def loss_and_grads(m: TransformerLM) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    ids, targets = batch()
    logits = m(ids)
    F.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
    return logits.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}


@pytest.mark.parametrize("group", [1, 2, 3, LAYERS, 10])
def test_same_logits_gradients_and_state_dict(group):
    plain, ckpt = model(), model(group)
    assert ckpt.state_dict().keys() == plain.state_dict().keys()
    logits0, grads0 = loss_and_grads(plain)
    logits1, grads1 = loss_and_grads(ckpt)
    torch.testing.assert_close(logits1, logits0, rtol=0, atol=0)
    for name in grads0:
        torch.testing.assert_close(grads1[name], grads0[name])


def test_set_checkpointing_validates_and_switches():
    m = model()
    m.set_checkpointing(2)
    assert m.checkpoint_group == 2
    with pytest.raises(ValueError, match="non-negative"):
        m.set_checkpointing(-1)
    with torch.no_grad():  # inference never checkpoints: no graph to save for
        m(batch()[0])


def _block_part(report) -> int:
    """Saved activation bytes of the blocks: with checkpointing, the group inputs the model's
    forward saves ('model'); without, every `layers.i` group."""
    groups = report.group_bytes()
    return sum(b for g, b in groups.items() if g.startswith("layers.") or g == "model")


@pytest.mark.parametrize("group", [1, 2, 3, 4])
def test_checkpointing_reduces_saved_bytes_by_the_expected_factor(group):
    # Without checkpointing every block saves its hand-counted tensors; with groups of g only
    # each group's input x (B, T, C) fp32 is saved, ceil(L / g) of them. The head and the loss
    # save the same either way.
    block = sum(n * e for _, n, e in hand_count_block())
    expected_factor = math.ceil(LAYERS / group) * BTC * 4 / (LAYERS * block)
    plain = measure_saved(model(), *batch())
    ckpt = measure_saved(model(group), *batch())
    assert _block_part(plain) == LAYERS * block
    assert _block_part(ckpt) / _block_part(plain) == pytest.approx(expected_factor, rel=1e-12)
    outside = {g: b for g, b in plain.group_bytes().items() if not g.startswith("layers.")}
    assert {g: b for g, b in ckpt.group_bytes().items() if g in outside} == outside


def test_check_groups():
    assert check_groups([2, 1, 2], 4) == [0, 2, 1]
    with pytest.raises(SpecError, match="larger than the model's 4 blocks"):
        check_groups([5], 4)
    with pytest.raises(SpecError, match="non-negative"):
        check_groups([-1], 4)
    with pytest.raises(SpecError, match="reference LM only"):
        set_checkpointing(torch.nn.Linear(2, 2), 1)


def test_sweep_produces_the_tradeoff_table():
    spec = RunSpec(size="custom", d_model=C, num_layers=LAYERS, num_heads=H, d_ff=D_FF,
                   vocab_size=V, context=T, batch=B, optimizer="foreach")
    rows = sweep_checkpointing(spec, [1, LAYERS], steps=1, warmup=1)
    assert [r.group for r in rows] == [0, 1, LAYERS]
    assert all(r.status == "ok" and r.saved_device == "meta" for r in rows)
    assert [r.saved_bytes for r in rows] == [r.expected_saved_bytes for r in rows]
    table = tradeoff_frame(rows)
    assert list(table["group"]) == ["none", 1, LAYERS]
    assert table["saved x"].iloc[0] == 1.0 and table["saved x"].iloc[1] < 0.5
    assert table["step ms (median)"].notna().all()
    assert "peak RSS MiB (CPU process)" in table.columns
