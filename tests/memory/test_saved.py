"""Saved-for-backward accounting against an independent hand count of one block's tensors."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from lmperf.workload.spec import RunSpec
from lmperf.questions.memory.saved import measure_saved, measure_spec, meta_equivalent
from lmperf.runtime.precision import autocast, get_regime
from tests.memory.handcount import BTC, C, F, H, L, V, B, batch, hand_count_block, tiny

def block_rows(report, group: str = "layers.0"):
    return [t for t in report.tensors if t.group == group]


@pytest.mark.parametrize("attention", ["naive", "sdpa"])
@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_one_block_matches_the_hand_count(attention, precision):
    regime = get_regime(precision)
    report = measure_saved(tiny(attention), *batch(),
                           lambda: autocast(regime, torch.device("cpu")))
    hand = hand_count_block(attention, mixed=regime.autocast_dtype is not None)
    counted = [t for t in block_rows(report) if t.kind == "activation" and t.bytes]
    assert Counter(t.bytes for t in counted) == Counter(n * e for _, n, e in hand)
    assert report.block_bytes()["layers.0"] == sum(n * e for _, n, e in hand)
    assert report.block_bytes()["layers.1"] == report.block_bytes()["layers.0"]


def test_parameters_buffers_and_inputs_are_listed_but_not_counted():
    ids, targets = batch()
    report = measure_saved(tiny(), ids, targets)
    rows = block_rows(report)
    params = [t for t in rows if t.kind == "parameter"]
    # 7 linear weights (as weight.t(), a view) + the 2 RMSNorm weights
    assert len(params) == 9
    assert {t.shape for t in params} == {(C,), (C, C), (C, F), (F, C)}
    assert [t.kind for t in rows].count("buffer") == 8  # cos, sin x (x1, x2) x (q, k)
    inputs = [t for t in report.tensors if t.kind == "input"]
    assert {t.group for t in inputs} == {"token_embeddings", "loss"}
    activations = sum(t.bytes for t in report.tensors if t.kind == "activation")
    assert report.total() == activations
    assert report.total("weight copy") == 0  # fp32: no autocast casts


def test_autocast_weight_copies_are_their_own_kind():
    regime = get_regime("bf16-mixed")
    report = measure_saved(tiny(), *batch(), lambda: autocast(regime, torch.device("cpu")))
    copies = [t for t in block_rows(report) if t.kind == "weight copy"]
    assert len(copies) == 7 and {t.dtype for t in copies} == {"bfloat16"}
    assert sum(t.bytes for t in copies) == 2 * (4 * C * C + 3 * C * F)


def test_ops_groups_and_the_residual_yardstick():
    report = measure_saved(tiny(), *batch())
    ops = {t.op for t in report.tensors}
    assert {"Pow.self", "Rsqrt.result", "Exp.result", "LogSoftmax.result"} <= ops
    assert "outside the loss graph" not in ops
    # the RoPE module is shared by every block: its saves belong to the block that ran it
    assert {t.group for t in report.tensors if t.kind == "buffer"} == {"layers.0", "layers.1"}
    assert report.residual_bytes == BTC * 4
    groups = report.by_group()
    assert list(groups["group"]) == ["token_embeddings", "layers.0", "layers.1", "ln_final",
                                     "lm_head", "loss", "total"]
    top = report.top(3)
    assert top["share"].is_monotonic_decreasing and len(top) == 3
    assert top.iloc[0]["op"] == "LogSoftmax.result"  # (B T, V) fp32 log-probabilities


@pytest.mark.parametrize("context", [8, 24])
def test_meta_device_saves_the_same_bytes_as_the_cpu(context):
    spec = RunSpec(size="custom", d_model=C, num_layers=L, num_heads=H, d_ff=F, vocab_size=V,
                   context=context, batch=B)
    assert meta_equivalent(spec)
    cpu = measure_spec(spec, torch.device("cpu"))
    meta = measure_spec(spec, torch.device("meta"))
    assert meta.device == "meta"
    assert [(t.group, t.shape, t.kind, t.bytes) for t in meta.tensors] == \
        [(t.group, t.shape, t.kind, t.bytes) for t in cpu.tensors]
    assert not meta_equivalent(spec.with_(attention="sdpa"))
    assert not meta_equivalent(spec.with_(precision="bf16-mixed"))
