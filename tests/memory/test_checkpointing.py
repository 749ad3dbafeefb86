"""Activation checkpointing: same numbers under every policy, the expected saved-bytes factor,
what `op` saves, the trade-off table."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lmperf.workload.spec import RunSpec
from lmperf.errors import SpecError
from lmperf.questions.memory.checkpointing import check_groups, sweep_checkpointing, tradeoff_frame
from lmperf.model.checkpointing import set_checkpointing
from lmperf.questions.memory.saved import measure_saved
from lmperf.model import TransformerLM
from tests.memory.handcount import BTC, B, C, F as D_FF, H, T, V, batch, hand_count_block

LAYERS = 4


def model(policy: str | int = "none") -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(V, 16, C, LAYERS, H, D_FF, checkpoint=policy)


def loss_and_grads(m: TransformerLM) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    ids, targets = batch()
    logits = m(ids)
    F.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
    return logits.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}


@pytest.mark.parametrize("group", [1, 2, 3, LAYERS, 10, "op", "every-2", "every-3"])
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
    assert m.checkpoint == 2
    for alias, name in ((0, "none"), (1, "full"), ("every-1", "full"), ("4", 4), ("OP", "op")):
        m.set_checkpointing(alias)
        assert m.checkpoint == name
    for bad in (-1, "every-0", "some", 2.5, True):
        with pytest.raises(ValueError, match="unknown checkpointing policy"):
            m.set_checkpointing(bad)
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


def test_every_k_checkpoints_one_block_in_k_as_torchtitan_counts_them():
    # torchtitan 0.2 counts blocks from 1 and checkpoints those whose count K divides: with
    # every-2 blocks 1 and 3 keep only their input, blocks 0 and 2 everything
    block = sum(n * e for _, n, e in hand_count_block())
    every = measure_saved(model("every-2"), *batch())
    assert _block_part(every) == 2 * block + 2 * BTC * 4
    assert [g for g in every.group_bytes() if g.startswith("layers.")] == ["layers.0", "layers.2"]
    from lmperf.model.checkpointing import block_spans

    assert [(a, b, f is not None) for a, b, f in block_spans("every-2", 5)] == [
        (0, 1, False), (1, 2, True), (2, 3, False), (3, 4, True), (4, 5, False)]
    assert [(a, b) for a, b, _ in block_spans(2, 5)] == [(0, 2), (2, 4), (4, 5)]


def test_op_saves_every_other_matmul_and_the_attention_matmuls(monkeypatch):
    """torchtitan's per-op policy on one block: of its 7 matmuls (q, k, v, output projection,
    w1, w3, w2, in that order) the 1st, 3rd, 5th and 7th outputs are saved, the others
    recomputed; naive attention's two batched matmuls (scores, combine) are saved."""
    from lmperf.model import checkpointing as ck

    decisions, original = [], ck.op_policy

    def logged():
        policy = original()

        def f(ctx, func, *args, **kwargs):
            d = policy(ctx, func, *args, **kwargs)
            if not ctx.is_recompute and "mm" in str(func):
                decisions.append((str(func).split(".")[1], d.name == "MUST_SAVE"))
            return d
        return f

    monkeypatch.setattr(ck, "op_policy", logged)
    loss_and_grads(TransformerLM(V, 16, C, 1, H, D_FF, checkpoint="op"))
    assert decisions == [("mm", True), ("mm", False), ("mm", True), ("bmm", True),
                         ("bmm", True), ("mm", False), ("mm", True), ("mm", False),
                         ("mm", True)]


def test_check_groups():
    assert check_groups([2, 1, 2, "every-2", "op"], 4) == ["none", 2, "full", "every-2", "op"]
    with pytest.raises(SpecError, match="larger than the model's 4 blocks"):
        check_groups([5], 4)
    with pytest.raises(SpecError, match="would checkpoint no block"):
        check_groups(["every-5"], 4)
    with pytest.raises(SpecError, match="unknown checkpointing policy"):
        check_groups([-1], 4)
    with pytest.raises(SpecError, match="the reference LM's"):
        set_checkpointing(torch.nn.Linear(2, 2), 1)


def test_sweep_produces_the_tradeoff_table():
    spec = RunSpec(size="custom", d_model=C, num_layers=LAYERS, num_heads=H, d_ff=D_FF,
                   vocab_size=V, context=T, batch=B, optimizer="foreach")
    rows = sweep_checkpointing(spec, [1, LAYERS, "every-2"], steps=1, warmup=1)
    assert [r.group for r in rows] == ["none", "full", LAYERS, "every-2"]
    assert all(r.status == "ok" and r.saved_device == "meta" for r in rows)
    assert [r.saved_bytes for r in rows] == [r.expected_saved_bytes for r in rows]
    table = tradeoff_frame(rows)
    assert list(table["group"]) == ["none", "full", LAYERS, "every-2"]
    assert table["saved x"].iloc[0] == 1.0 and table["saved x"].iloc[1] < 0.5
    assert table["step ms (median)"].notna().all()
    assert "peak RSS MiB (CPU process)" in table.columns
