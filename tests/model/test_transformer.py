"""The reference LM against an independent re-implementation of the course's model.

Everything here runs on CPU in a few seconds with tiny shapes.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lmperf.model import PRESETS, VOCAB_SIZE, TransformerLM, make_attention
from lmperf.model.transformer import RMSNorm, RotaryEmbedding
from tests.model.reference import ReferenceLM, expected_shapes, rms_norm, rope

TINY = dict(vocab_size=50, context_length=16, d_model=16, num_layers=2, num_heads=4, d_ff=40)
ATTENTIONS = ("naive", "sdpa")


def tiny_model(attention: str = "naive", seed: int = 0, **overrides) -> TransformerLM:
    torch.manual_seed(seed)
    return TransformerLM(**{**TINY, **overrides}, attention=attention)


def tokens(batch: int = 3, seq: int = TINY["context_length"], seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY["vocab_size"], (batch, seq), generator=g)


def shapes_of(model: torch.nn.Module) -> dict[str, tuple]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


# -- 1. state dict ------------------------------------------------------------------------------

def test_state_dict_keys_and_shapes_tiny():
    model = tiny_model()
    assert shapes_of(model) == expected_shapes(50, 16, 2, 40)
    # RoPE tables exist as buffers but are not persistent
    assert any("cos" in name for name, _ in model.named_buffers())
    assert not any("cos" in k or "sin" in k for k in model.state_dict())


def test_state_dict_keys_and_shapes_small_preset_on_meta():
    p = PRESETS["small"]
    assert (p.d_model, p.d_ff, p.num_layers, p.num_heads) == (768, 3072, 12, 12)
    with torch.device("meta"):
        model = TransformerLM(VOCAB_SIZE, 256, p.d_model, p.num_layers, p.num_heads, p.d_ff)
    got = shapes_of(model)
    assert got == expected_shapes(VOCAB_SIZE, 768, 12, 3072)
    assert len(got) == 2 + 12 * 9 + 1
    assert max(int(k.split(".")[1]) for k in got if k.startswith("layers.")) == 11


# -- 2. logits equal the independent reference ---------------------------------------------------

@pytest.mark.parametrize("attention", ATTENTIONS)
def test_lmperf_weights_into_reference(attention):
    model = tiny_model(attention)
    ref = ReferenceLM(**TINY)
    ref.load_state_dict(model.state_dict(), strict=True)
    ids = tokens()
    with torch.no_grad():
        got, want = model(ids), ref(ids)
    assert got.shape == (3, 16, 50) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_reference_weights_into_lmperf_strict(attention):
    torch.manual_seed(123)
    ref = ReferenceLM(**TINY)  # random non-unit norm weights, larger projections than the init
    model = TransformerLM(**TINY, attention=attention)
    result = model.load_state_dict(ref.state_dict(), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    ids = tokens(seq=11)  # shorter than the context too
    with torch.no_grad():
        got, want = model(ids), ref(ids)
    assert want.abs().max() > 1  # the comparison is not between near-zero tensors
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_gradients_match_reference():
    torch.manual_seed(7)
    ref = ReferenceLM(**TINY)
    model = TransformerLM(**TINY)
    model.load_state_dict(ref.state_dict())
    ids, targets = tokens(seed=2), tokens(seed=3)
    for m in (model, ref):
        F.cross_entropy(m(ids).flatten(0, 1), targets.flatten()).backward()
    ref_grads = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref_grads[name].grad, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("variant", ["rope_halves", "heads_inner", "no_rope", "post_norm"])
def test_reference_comparison_detects_wrong_variants(variant):
    """Negative control: each plausible mistake changes the logits far beyond the tolerance."""
    model = tiny_model()
    wrong = ReferenceLM(**TINY, variant=variant)
    wrong.load_state_dict(model.state_dict())
    with torch.no_grad():
        diff = (model(tokens()) - wrong(tokens())).abs().max()
    assert diff > 1e-3


def test_rope_module_matches_rotation_matrices():
    d_k, t = 8, 12
    rot = RotaryEmbedding(context_length=16, head_dim=d_k, theta=10000.0)
    x = torch.randn(2, 3, t, d_k, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(rot(x), rope(x, 10000.0), rtol=0, atol=1e-5)
    # position 0 is the identity, and rotations preserve each pair's norm
    torch.testing.assert_close(rot(x)[..., 0, :], x[..., 0, :])
    pair_norm = lambda y: y.unflatten(-1, (-1, 2)).norm(dim=-1)  # noqa: E731
    torch.testing.assert_close(pair_norm(rot(x)), pair_norm(x))
    with pytest.raises(ValueError):
        RotaryEmbedding(16, 7)


def test_rope_theta_is_used():
    torch.manual_seed(0)
    a = TransformerLM(**TINY, rope_theta=10000.0)
    b = TransformerLM(**TINY, rope_theta=500.0)
    b.load_state_dict(a.state_dict())
    ref = ReferenceLM(**TINY, rope_theta=500.0)
    ref.load_state_dict(a.state_dict())
    with torch.no_grad():
        assert (a(tokens()) - b(tokens())).abs().max() > 1e-4
        torch.testing.assert_close(b(tokens()), ref(tokens()), rtol=0, atol=1e-5)


# -- 3. naive vs sdpa -----------------------------------------------------------------------------

def _logits_and_grads(model: TransformerLM, ids, targets):
    model.zero_grad(set_to_none=True)
    logits = model(ids)
    F.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_naive_and_sdpa_agree_fp32():
    naive = tiny_model("naive")
    sdpa = tiny_model("sdpa")
    sdpa.load_state_dict(naive.state_dict())
    ids, targets = tokens(seed=4), tokens(seed=5)
    l1, g1 = _logits_and_grads(naive, ids, targets)
    l2, g2 = _logits_and_grads(sdpa, ids, targets)
    torch.testing.assert_close(l1, l2, rtol=1e-5, atol=1e-5)
    assert g1.keys() == g2.keys() == dict(naive.named_parameters()).keys()
    for name in g1:
        assert g1[name].abs().max() > 0, name  # every parameter takes part
        torch.testing.assert_close(g1[name], g2[name], rtol=1e-5, atol=1e-5, msg=name)


def test_naive_and_sdpa_attention_agree_fp64():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 9, 8, dtype=torch.float64, generator=g, requires_grad=True)
               for _ in range(3))
    out_n = make_attention("naive")(q, k, v)
    out_s = make_attention("sdpa")(q, k, v)
    assert out_n.dtype == torch.float64
    torch.testing.assert_close(out_n, out_s, rtol=1e-12, atol=1e-12)
    gn = torch.autograd.grad(out_n.square().sum(), (q, k, v))
    gs = torch.autograd.grad(out_s.square().sum(), (q, k, v))
    for a, b in zip(gn, gs):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)


def test_naive_and_sdpa_agree_fp64_model():
    naive = tiny_model("naive").double()
    sdpa = tiny_model("sdpa").double()
    sdpa.load_state_dict(naive.state_dict())
    ids, targets = tokens(seed=4), tokens(seed=5)
    l1, g1 = _logits_and_grads(naive, ids, targets)
    l2, g2 = _logits_and_grads(sdpa, ids, targets)
    assert l1.dtype == torch.float64
    # RMSNorm computes in fp32 by design (as the course's does), so fp64 end to end is only
    # as exact as fp32 rounding of identical-to-1e-15 inputs: still tighter than the fp32 test.
    torch.testing.assert_close(l1, l2, rtol=1e-6, atol=1e-6)
    for name in g1:
        torch.testing.assert_close(g1[name], g2[name], rtol=1e-6, atol=1e-6, msg=name)


# -- 4. causality ---------------------------------------------------------------------------------

@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("t", [0, 5, 15])
def test_causal(attention, t):
    model = tiny_model(attention)
    ids = tokens(batch=2)
    changed = ids.clone()
    changed[:, t] = (changed[:, t] + 1) % TINY["vocab_size"]
    with torch.no_grad():
        a, b = model(ids), model(changed)
    torch.testing.assert_close(a[:, :t], b[:, :t], rtol=0, atol=1e-6)
    assert (a[:, t] - b[:, t]).abs().max() > 1e-4  # the changed position itself does change
    if t + 1 < ids.shape[1]:
        assert (a[:, t + 1:] - b[:, t + 1:]).abs().amax(dim=-1).min() > 0  # and every later one


# -- 5. sequence length -----------------------------------------------------------------------------

@pytest.mark.parametrize("attention", ATTENTIONS)
def test_sequence_longer_than_context_raises(attention):
    model = tiny_model(attention)
    with pytest.raises(ValueError, match="context_length"):
        model(tokens(seq=17))


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_shorter_sequence_is_prefix_of_full(attention):
    model = tiny_model(attention)
    full = tokens(seq=16)
    with torch.no_grad():
        out_full = model(full)
        out_short = model(full[:, :7])
        out_one = model(full[:, :1])
    assert out_short.shape == (3, 7, 50) and out_one.shape == (3, 1, 50)
    torch.testing.assert_close(out_short, out_full[:, :7], rtol=0, atol=1e-5)
    torch.testing.assert_close(out_one, out_full[:, :1], rtol=0, atol=1e-5)


# -- 7. precision ---------------------------------------------------------------------------------

def test_rmsnorm_bf16_in_bf16_out_matches_fp32():
    torch.manual_seed(0)
    norm = RMSNorm(64)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.5 * torch.randn(64))
    x = (3 * torch.randn(4, 5, 64)).to(torch.bfloat16)
    with torch.no_grad():
        out = norm(x)
    assert out.dtype == torch.bfloat16
    want = rms_norm(x.float(), norm.weight.detach()).to(torch.bfloat16)
    # same fp32 math up to rsqrt vs 1/sqrt: at most one bf16 rounding step apart
    torch.testing.assert_close(out, want, rtol=2 ** -7, atol=0)
    assert (out == want).float().mean() > 0.99
    # and not what bf16 arithmetic end to end would give
    xb = x
    lowp = xb * torch.rsqrt(xb.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight.detach().to(xb.dtype)
    assert (lowp != want).any()


def test_rmsnorm_fp16_large_inputs_do_not_overflow():
    norm = RMSNorm(32)
    x = torch.full((2, 32), 1000.0, dtype=torch.float16)  # x**2 = 1e6 > fp16 max 65504
    x[1] = torch.linspace(-900, 900, 32)
    with torch.no_grad():
        out = norm(x)
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    torch.testing.assert_close(out, rms_norm(x.float(), norm.weight.detach()).half())


def test_rmsnorm_fp32_matches_reference():
    torch.manual_seed(0)
    norm = RMSNorm(16)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(16))
    x = torch.randn(3, 16) * 0.01  # eps matters at this scale
    torch.testing.assert_close(norm(x), rms_norm(x, norm.weight), rtol=1e-6, atol=1e-7)
    assert norm.eps == 1e-5


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_autocast_bf16_logits(attention):
    model = tiny_model(attention)
    ids = tokens()
    with torch.no_grad():
        fp32 = model(ids)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = model(ids)
    assert bf16.dtype == torch.bfloat16
    assert torch.isfinite(bf16).all()
    assert all(p.dtype == torch.float32 for p in model.parameters())  # weights untouched
    err = (bf16.float() - fp32).abs().max() / fp32.abs().max()
    assert 0 < err < 0.05


def test_model_cast_to_bf16_keeps_working():
    model = tiny_model().to(torch.bfloat16)
    with torch.no_grad():
        out = model(tokens())
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


# -- 8. construction errors -----------------------------------------------------------------------

def test_unknown_attention_names_the_accepted_ones():
    with pytest.raises(ValueError) as info:
        TransformerLM(**TINY, attention="flash")
    msg = str(info.value)
    assert "'flash'" in msg and "naive" in msg and "sdpa" in msg
    with pytest.raises(ValueError, match="naive, sdpa"):
        make_attention("Naive")


def test_d_model_not_divisible_by_heads():
    with pytest.raises(ValueError, match="divisible"):
        TransformerLM(**{**TINY, "d_model": 18, "num_heads": 4})  # 18 // 4 = 4, even: not RoPE's error


@pytest.mark.parametrize("field", ["vocab_size", "context_length", "d_model", "num_layers",
                                   "num_heads", "d_ff"])
@pytest.mark.parametrize("bad", [0, -1, 2.0])
def test_non_positive_or_non_int_hyperparameters(field, bad):
    with pytest.raises(ValueError, match=field):
        TransformerLM(**{**TINY, field: bad})
