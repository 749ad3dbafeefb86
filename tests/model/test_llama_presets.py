"""Llama-3 presets: grouped-query attention (GQA), tied embeddings, and parameter counts equal to
the published ones. Tiny shapes on the CPU; the big presets only on the meta device."""

from __future__ import annotations

import math

import pytest
import torch

from lmperf.core.vocabulary import OPTIONS
from lmperf.errors import SpecError
from lmperf.model import EDITIONS, ModelConfig, TransformerLM, build_model, count_params
from lmperf.model.presets import COURSE_TABLE
from lmperf.questions.memory.estimate import estimate, param_count, param_tensors
from lmperf.workload.spec import RunSpec
from tests.model.reference import ReferenceLM, rope

# Counted here on the meta device; the model cards (huggingface.co/meta-llama) publish 1.24B,
# 3.21B, 8.03B, 70.6B and 405B (Llama-3.1-405B's config.json: hidden 16384, FFN 53248, 126
# layers, 128 heads), the safetensors index of 8B 8,030,261,248.
PUBLISHED = {"llama3-1b": 1_235_814_400, "llama3-3b": 3_212_749_824,
             "llama3-8b": 8_030_261_248, "llama3-70b": 70_553_706_496,
             "llama3-405b": 405_853_388_800}
TINY = dict(vocab_size=50, context_length=16, d_model=32, num_layers=2, num_heads=4, d_ff=40)


def tokens(batch: int = 2, seq: int = 16) -> torch.Tensor:
    return torch.randint(0, TINY["vocab_size"], (batch, seq), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("size", PUBLISHED)
def test_param_counts_are_the_published_ones(size):
    config = RunSpec.from_size(size, context=8).model_config()
    with torch.device("meta"):
        model = build_model(config, None)
    assert param_count(config) == count_params(model) == PUBLISHED[size]
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED[size]
    assert param_tensors(config) == len(list(model.parameters()))
    assert config.num_kv_heads == 8 and config.rope_theta == 500_000.0
    assert config.tie_embeddings == (size in ("llama3-1b", "llama3-3b"))


def test_presets_are_in_every_edition_not_in_the_course_tables():
    for course, sizes in EDITIONS.items():
        assert set(PUBLISHED) <= set(sizes)
        assert not set(PUBLISHED) & set(COURSE_TABLE[course])
    assert set(PUBLISHED) <= set(OPTIONS["size"].choices())  # --size accepts them


def test_long_context_is_accepted():
    spec = RunSpec.from_size("llama3-8b", context=131_072, batch=1)
    assert spec.model_config().context_length == 131_072
    assert "Hkv=8" in spec.shape() and "V=128256" in spec.shape()
    assert RunSpec.from_dict(spec.to_dict()) == spec  # the record reads back whole


def test_gqa_with_as_many_kv_heads_as_heads_is_the_course_model():
    torch.manual_seed(0)
    plain = TransformerLM(**TINY)
    torch.manual_seed(0)
    same = TransformerLM(**TINY, num_kv_heads=TINY["num_heads"])
    ref = ReferenceLM(**TINY)  # the course's model: its state dict still loads strict
    for model in (plain, same):
        model.load_state_dict(ref.state_dict(), strict=True)
        with torch.no_grad():
            torch.testing.assert_close(model(tokens()), ref(tokens()), rtol=0, atol=1e-5)
    assert ModelConfig(**{k: v for k, v in TINY.items()}).as_kwargs().keys() == {
        *TINY, "rope_theta", "attention"}  # old factories taking **as_kwargs() keep working


def _explicit_attention(attn, x: torch.Tensor, heads: int, kv_heads: int) -> torch.Tensor:
    """Causal GQA written head by head: query head h reads K/V head h // (heads / kv_heads)."""
    B, T, C = x.shape
    D = C // heads
    q = (x @ attn.q_proj.weight.T).view(B, T, heads, D).transpose(1, 2)  # (B, H, T, D)
    k = (x @ attn.k_proj.weight.T).view(B, T, kv_heads, D).transpose(1, 2)  # (B, Hkv, T, D)
    v = (x @ attn.v_proj.weight.T).view(B, T, kv_heads, D).transpose(1, 2)
    q, k = rope(q, 10000.0), rope(k, 10000.0)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    out = []
    for h in range(heads):
        g = h // (heads // kv_heads)
        scores = (q[:, h] @ k[:, g].transpose(-1, -2) / math.sqrt(D)).masked_fill(~mask, -math.inf)
        out.append(scores.softmax(-1) @ v[:, g])  # (B, T, D)
    return torch.stack(out, 1).transpose(1, 2).reshape(B, T, C) @ attn.output_proj.weight.T


@pytest.mark.parametrize("attention", ["naive", "sdpa"])
@pytest.mark.parametrize("kv_heads", [1, 2])
def test_gqa_equals_an_explicit_computation(attention, kv_heads):
    torch.manual_seed(0)
    model = TransformerLM(**TINY, attention=attention, num_kv_heads=kv_heads)
    attn = model.layers[0].attn
    assert attn.k_proj.weight.shape == (kv_heads * 8, 32)  # Hkv * D rows
    x = torch.randn(2, 16, 32)
    with torch.no_grad():
        torch.testing.assert_close(attn(x), _explicit_attention(attn, x, 4, kv_heads),
                                   rtol=0, atol=1e-5)


@pytest.mark.parametrize("attention", ["naive", "sdpa"])
def test_gqa_equals_mha_with_repeated_kv_weights(attention):
    torch.manual_seed(0)
    gqa = TransformerLM(**TINY, attention=attention, num_kv_heads=2)
    mha = TransformerLM(**TINY, attention=attention)
    state = gqa.state_dict()
    for key in [k for k in state if k.endswith(("k_proj.weight", "v_proj.weight"))]:
        w = state[key].unflatten(0, (2, -1))  # (Hkv, D, C): each K/V head twice, in order
        state[key] = w.repeat_interleave(2, dim=0).flatten(0, 1)  # (H * D, C)
    mha.load_state_dict(state, strict=True)
    with torch.no_grad():
        torch.testing.assert_close(gqa(tokens()), mha(tokens()), rtol=0, atol=1e-5)


def test_tied_embeddings_are_one_parameter():
    torch.manual_seed(0)
    model = TransformerLM(**TINY, tie_embeddings=True)
    assert model.lm_head.weight is model.token_embeddings.weight
    assert count_params(model) == count_params(TransformerLM(**TINY)) - 50 * 32
    assert "lm_head.weight" not in model.state_dict()
    model(tokens()).sum().backward()  # the gradient of both uses lands in the one Parameter
    assert model.token_embeddings.weight.grad is not None
    with torch.device("meta"):
        meta = TransformerLM(**TINY, tie_embeddings=True)
    meta.to_empty(device="cpu")  # which unties a Parameter registered in two modules
    assert meta.lm_head.weight is meta.token_embeddings.weight


def test_bad_kv_heads_are_refused():
    with pytest.raises(ValueError, match="not a multiple of num_kv_heads 3"):
        TransformerLM(**TINY, num_kv_heads=3)
    with pytest.raises(ValueError, match="num_kv_heads must be a positive integer"):
        TransformerLM(**TINY, num_kv_heads=0)
    with pytest.raises(SpecError, match="num_kv_heads"):
        RunSpec.from_size("tiny", context=8, num_kv_heads=3)


def test_estimates_count_gqa_weights():
    spec = RunSpec.from_size("llama3-8b", context=128, batch=1, precision="bf16-mixed")
    config = spec.model_config()
    est = estimate(config, 1, 128, "bf16-mixed", attention="sdpa")
    C, F, kv, L, V = 4096, 14336, 1024, 32, 128_256
    assert est.weight_copy_bytes == 2 * (L * (2 * C * C + 2 * C * kv + 3 * C * F) + C * V)
