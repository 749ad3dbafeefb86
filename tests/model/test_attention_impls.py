"""The reference LM with each `lmperf.kernels` implementation: same logits and gradients."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from lmperf.errors import SpecError
from lmperf.model import ATTENTION, TransformerLM, make_attention
from lmperf.model.attention import KernelAttention, NaiveAttention
from lmperf.questions.profile.annotate import AnnotatedNaiveAttention, annotate_attention
from tests.model.reference import ReferenceLM

# The model's attention shapes are (3, 4, 16, 4): test_registry's compiled test uses the same, so
# in one session the compiled graph is built once.
TINY = dict(vocab_size=50, context_length=16, d_model=16, num_layers=2, num_heads=4, d_ff=40)
IMPLS = ["sdpa", "flash-torch", pytest.param("compiled", marks=pytest.mark.compile)]


def _tokens(seed: int, batch: int = 3, seq: int = 16) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY["vocab_size"], (batch, seq), generator=g)


def _logits_and_grads(model: torch.nn.Module, ids: torch.Tensor, targets: torch.Tensor):
    logits = model(ids)
    F.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
    return logits.detach(), {n: p.grad for n, p in model.named_parameters()}


def test_the_model_s_names_are_the_kernel_registry_s():
    from lmperf import kernels

    assert tuple(ATTENTION) == kernels.NAMES == ("naive", "sdpa", "compiled", "flash-torch",
                                                  "flash-triton")
    assert isinstance(make_attention("flash-torch"), KernelAttention)
    assert isinstance(make_attention("sdpa"), KernelAttention)
    # the naive one is the kernels' own class (the profiler swaps it for its annotated subclass)
    assert isinstance(make_attention("naive"), kernels.NaiveAttention)
    assert NaiveAttention is kernels.NaiveAttention


def test_an_unknown_name_is_a_spec_error_in_the_model_and_the_registry():
    from lmperf import kernels

    for call in (make_attention, kernels.get, lambda n: TransformerLM(**TINY, attention=n)):
        with pytest.raises(SpecError, match="unknown attention implementation 'flash'"):
            call("flash")


def test_the_naive_attention_is_causal_as_the_model_calls_it():
    from lmperf.kernels import naive_attention

    q, k, v = (torch.randn(2, 3, 10, 4) for _ in range(3))
    torch.testing.assert_close(NaiveAttention()(q, k, v), naive_attention(q, k, v, True))
    torch.testing.assert_close(AnnotatedNaiveAttention()(q, k, v), F.scaled_dot_product_attention(
        q, k, v, is_causal=True), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("attention", IMPLS)
def test_same_logits_and_gradients_as_naive_and_the_reference(attention):
    torch.manual_seed(7)
    ref = ReferenceLM(**TINY)  # independent model: explicit masked_fill + torch.softmax per head
    models = {}
    for name in ("naive", attention):
        models[name] = TransformerLM(**TINY, attention=name)
        models[name].load_state_dict(ref.state_dict(), strict=True)
    ids, targets = _tokens(2), _tokens(3)
    want_logits, want_grads = _logits_and_grads(ref, ids, targets)
    naive_logits, naive_grads = _logits_and_grads(models["naive"], ids, targets)
    got_logits, got_grads = _logits_and_grads(models[attention], ids, targets)
    assert want_logits.abs().max() > 1  # not a comparison of near-zero tensors
    torch.testing.assert_close(got_logits, want_logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(got_logits, naive_logits, rtol=0, atol=1e-5)
    for name, g in got_grads.items():
        torch.testing.assert_close(g, want_grads[name], rtol=1e-4, atol=1e-5, msg=name)
        torch.testing.assert_close(g, naive_grads[name], rtol=1e-4, atol=1e-5, msg=name)


def test_flash_torch_under_autocast_matches_naive_under_autocast():
    # Under CPU autocast the model hands over fp32 q, k and bf16 v; the adapter runs the kernel in
    # autocast's dtype, as the naive einsums would.
    torch.manual_seed(0)
    naive = TransformerLM(**TINY, attention="naive")
    flash = TransformerLM(**TINY, attention="flash-torch")
    flash.load_state_dict(naive.state_dict())
    ids = _tokens(1)
    with torch.no_grad():
        fp32 = naive(ids)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            a, b = naive(ids), flash(ids)
    assert a.dtype == b.dtype == torch.bfloat16
    scale = fp32.abs().max()
    assert (b.float() - fp32).abs().max() / scale < 0.05
    assert (b.float() - a.float()).abs().max() / scale < 0.05


def test_flash_torch_with_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    plain = TransformerLM(**TINY, attention="flash-torch")
    ckpt = TransformerLM(**TINY, attention="flash-torch", checkpoint="full")
    ckpt.load_state_dict(plain.state_dict())
    ids, targets = _tokens(4), _tokens(5)
    _, g1 = _logits_and_grads(plain, ids, targets)
    _, g2 = _logits_and_grads(ckpt, ids, targets)
    for name in g1:
        torch.testing.assert_close(g1[name], g2[name], msg=name)


def test_annotation_still_swaps_only_the_naive_attention():
    assert annotate_attention(TransformerLM(**TINY, attention="naive")) == TINY["num_layers"]
    model = TransformerLM(**TINY, attention="flash-torch")
    assert annotate_attention(model) == 0
    assert not any(isinstance(getattr(m, "attention", None), AnnotatedNaiveAttention)
                   for m in model.modules())


def test_flash_triton_without_triton_fails_at_construction(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "triton" else real(name, *a))
    with pytest.raises(SpecError, match="flash-triton needs triton; pip install triton"):
        TransformerLM(**TINY, attention="flash-triton")


@pytest.mark.parametrize("name", ["compiled", "flash-torch", "flash-triton"])
def test_bench_spec_accepts_the_new_names(name):
    from lmperf.workload.spec import RunSpec

    assert RunSpec.from_size("tiny", attention=name).attention == name
