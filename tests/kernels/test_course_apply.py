"""The course's harness calls the autograd Functions directly: `Fn.apply(q, k, v, is_causal)`,
or `Fn.apply(q, k, v)`; both must work with the tile sizes left at their defaults."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from lmperf.kernels.flash_torch import FlashAttentionTorch
from lmperf.kernels.naive import naive_attention
from tests.kernels.conftest import TRITON_USABLE, make_inputs

runs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or not TRITON_USABLE,
    reason="triton is not installed, or was imported before TRITON_INTERPRET=1 could be set")


def _triton_fn():
    from lmperf.kernels.flash_triton import FlashAttentionTriton

    return FlashAttentionTriton


FUNCTIONS = [pytest.param(lambda: FlashAttentionTorch, id="torch"),
             pytest.param(_triton_fn, id="triton", marks=runs_triton)]


def _grads(call, q, k, v, do):
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    o = call(*leaves)
    o.backward(do)
    return o.detach(), *(t.grad for t in leaves)


@pytest.mark.parametrize("causal_args", [(True,), ()], ids=["apply(q,k,v,True)", "apply(q,k,v)"])
@pytest.mark.parametrize("function", FUNCTIONS)
def test_apply_as_the_course_calls_it_matches_naive(function, causal_args, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # read by flash-triton's launch on the CPU
    fn = function()
    q, k, v, do = make_inputs((2, 40, 16))  # (batch, seq, d) as in the course's tests
    got = _grads(lambda q, k, v: fn.apply(q, k, v, *causal_args), q, k, v, do)
    want = _grads(lambda q, k, v: naive_attention(q, k, v, *causal_args), q, k, v, do)
    for what, a, b in zip(("o", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, msg=what)


@pytest.mark.parametrize("function", FUNCTIONS)
def test_the_logsumexp_is_saved_for_the_courses_harness(function, monkeypatch):
    # The course's test finds L among o.grad_fn.saved_tensors by its shape (batch, n_queries).
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    q, k, v, _ = make_inputs((2, 40, 16))
    o = function().apply(q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), True)
    assert any(t.shape == (2, 40) for t in o.grad_fn.saved_tensors)
