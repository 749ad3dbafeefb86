"""FLOPs per step: the analytic formula against torch's FLOP counter on a tiny reference LM."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from lmperf.workload.steps import NO_OBSERVER, StepState, train_step
from lmperf.measure.flops import (BACKWARD_MODES, FlopEstimate, analytic_flops,
                                  count_flops, matmul_params)
from lmperf.model import TransformerLM

V, T, C, L, H, FF, B = 100, 16, 32, 2, 4, 64, 2
SHAPE = dict(d_model=C, num_layers=L, d_ff=FF, vocab_size=V)


def tiny(attention: str) -> tuple[TransformerLM, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = TransformerLM(V, T, C, L, H, FF, attention=attention)
    x = torch.randint(0, V, (B, T), generator=gen)
    y = torch.randint(0, V, (B, T), generator=gen)
    return model, x, y


def run_mode(model, x, y, mode: str):
    def forward():
        with torch.no_grad():
            F.cross_entropy(model(x).flatten(0, 1), y.flatten())

    def forward_backward():
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()

    return {"forward": forward, "forward-backward": forward_backward}[mode]


@pytest.mark.parametrize("mode", ["forward", "forward-backward"])
def test_counted_equals_analytic_with_naive_attention(mode):
    model, x, y = tiny("naive")
    counted, per_op = count_flops(run_mode(model, x, y, mode))
    est = analytic_flops(**SHAPE, batch=B, seq=T, mode=mode)
    assert counted == est.total
    assert counted == sum(per_op.values())
    if mode == "forward-backward":
        assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("mode", ["forward", "forward-backward"])
def test_sdpa_on_cpu_misses_exactly_the_attention_term(mode):
    model, x, y = tiny("sdpa")
    counted, per_op = count_flops(run_mode(model, x, y, mode))
    est = analytic_flops(**SHAPE, batch=B, seq=T, mode=mode)
    assert est.attention > 0
    assert counted == est.matmul
    assert counted + est.attention == est.total


def test_train_step_counted_equals_analytic():
    model, x, y = tiny("naive")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    state = StepState(model, x, y, contextlib.nullcontext,
                      torch.amp.GradScaler("cpu", enabled=False), opt)
    counted, _ = count_flops(lambda: train_step(state, NO_OBSERVER))
    assert counted == analytic_flops(**SHAPE, batch=B, seq=T, mode="train-step").total


def test_count_flops_of_a_plain_matmul():
    a, b = torch.randn(3, 5), torch.randn(5, 7)
    total, per_op = count_flops(lambda: a @ b)
    assert total == 2 * 3 * 5 * 7
    assert per_op == {"aten.mm": 2 * 3 * 5 * 7}


def test_count_flops_of_nothing():
    assert count_flops(lambda: None) == (0, {})


def test_analytic_formula():
    n = matmul_params(**SHAPE)
    assert n == L * (4 * C * C + 3 * C * FF) + C * V
    fwd = analytic_flops(**SHAPE, batch=B, seq=T, mode="forward")
    assert fwd == FlopEstimate(matmul=2 * n * B * T, attention=L * 4 * B * T * T * C)
    fb = analytic_flops(**SHAPE, batch=B, seq=T, mode="forward-backward")
    assert fb.matmul == 6 * n * B * T and fb.attention == 12 * L * B * T * T * C
    assert fb.total == fb.matmul + fb.attention


def test_train_step_counts_as_three_forwards():
    assert set(BACKWARD_MODES) == {"forward-backward", "train-step"}
    for batch, seq in ((1, 1), (2, 16), (8, 1024)):
        fwd = analytic_flops(**SHAPE, batch=batch, seq=seq, mode="forward")
        for mode in ("forward-backward", "train-step"):
            est = analytic_flops(**SHAPE, batch=batch, seq=seq, mode=mode)
            assert est.matmul == 3 * fwd.matmul and est.attention == 3 * fwd.attention
            assert est.total == 3 * fwd.total


def test_matmul_params_matches_the_model():
    model, _, _ = tiny("naive")
    total = sum(p.numel() for p in model.parameters())
    norms = (2 * L + 1) * C
    assert matmul_params(**SHAPE) == total - V * C - norms


def test_matmul_params_small_preset():
    # The 'small' preset has 128,625,408 parameters; the embedding (V x C) and the 25 RMSNorm
    # weight vectors (2 per layer x 12 + the final one) take no part in matmuls.
    expected = 128_625_408 - 10_000 * 768 - 25 * 768
    assert expected == 120_926_208
    assert matmul_params(d_model=768, num_layers=12, d_ff=3072, vocab_size=10_000) == expected


def test_flop_estimate_total():
    assert FlopEstimate(matmul=5, attention=7).total == 12
