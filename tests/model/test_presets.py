"""Size presets: the course's shapes and their parameter counts, computed on the meta device."""

from __future__ import annotations

import pytest
import torch

from lmperf.model import (COURSE_SIZES, EDITIONS, PRESETS, VOCAB_SIZE, ModelConfig, TransformerLM,
                          build_model, count_params, inspect_on_meta)
from lmperf.model.presets import resolve_preset

# CS336 Assignment 2, Table 1, with the course's 10k vocabulary and an untied lm_head.
EXPECTED_PARAMS = {
    "small": 128_625_408,
    "medium": 423_183_360,
    "large": 969_411_840,
    "xl": 1_998_235_200,
    "2.7B": 3_406_809_600,
}
TABLE_1 = {  # d_model, d_ff, num_layers, num_heads
    "small": (768, 3072, 12, 12),
    "medium": (1024, 4096, 24, 16),
    "large": (1280, 5120, 36, 20),
    "xl": (1600, 6400, 48, 25),
    "2.7B": (2560, 10240, 32, 32),
}


def config_for(size: str, context_length: int = 256, vocab: int = VOCAB_SIZE) -> ModelConfig:
    p = EDITIONS["2025"].get(size) or PRESETS[size]  # Table 1 is 2025's
    return ModelConfig(vocab_size=vocab, context_length=context_length, d_model=p.d_model,
                       num_layers=p.num_layers, num_heads=p.num_heads, d_ff=p.d_ff)


def formula(vocab: int, d: int, f: int, layers: int) -> int:
    """Embedding + lm_head + per layer (4 d^2 attention + 3 d f SwiGLU + 2 norms) + final norm."""
    return 2 * vocab * d + layers * (4 * d * d + 3 * d * f + 2 * d) + d


def test_course_sizes_are_table_1():
    assert COURSE_SIZES == tuple(TABLE_1)
    for size, shape in TABLE_1.items():
        p = EDITIONS["2025"].get(size) or PRESETS[size]  # Table 1 is 2025's
        assert (p.d_model, p.d_ff, p.num_layers, p.num_heads) == shape
    assert VOCAB_SIZE == 10_000


@pytest.mark.parametrize("size", PRESETS)
def test_every_preset_has_a_valid_head_dim(size):
    p = EDITIONS["2025"].get(size) or PRESETS[size]  # Table 1 is 2025's
    assert p.d_model % p.num_heads == 0 and (p.d_model // p.num_heads) % 2 == 0


@pytest.mark.parametrize("size", COURSE_SIZES)
def test_param_count_inspect_on_meta(size):
    assert inspect_on_meta(config_for(size), None, batch_size=1) == EXPECTED_PARAMS[size]


@pytest.mark.parametrize("size", COURSE_SIZES)
def test_param_count_direct_on_meta(size):
    cfg = config_for(size, context_length=512)  # the count does not depend on the context
    with torch.device("meta"):
        model = TransformerLM(**cfg.as_kwargs())
    params = list(model.parameters())
    assert all(p.is_meta for p in params)  # no real storage was allocated
    assert all(b.is_meta for b in model.buffers())
    n = sum(p.numel() for p in params)
    p = EDITIONS["2025"].get(size) or PRESETS[size]  # Table 1 is 2025's
    assert n == count_params(model) == EXPECTED_PARAMS[size]
    assert n == formula(VOCAB_SIZE, p.d_model, p.d_ff, p.num_layers)


def test_build_model_on_meta_allocates_nothing():
    with torch.device("meta"):
        model = build_model(config_for("2.7B"))
    assert isinstance(model, TransformerLM)
    assert {t.device.type for t in model.state_dict().values()} == {"meta"}


def test_count_params_counts_shared_parameters_once():
    torch.manual_seed(0)
    model = TransformerLM(50, 8, 16, 1, 4, 32)
    n = count_params(model)
    model.lm_head.weight = model.token_embeddings.weight  # tie
    assert count_params(model) == n - 50 * 16


def test_small_model_param_count_matches_formula_on_cpu():
    cfg = ModelConfig(vocab_size=97, context_length=8, d_model=24, num_layers=3, num_heads=6,
                      d_ff=56)
    model = build_model(cfg)
    assert next(model.parameters()).device.type == "cpu"
    assert count_params(model) == formula(97, 24, 56, 3)
    assert inspect_on_meta(cfg, None, batch_size=2) == count_params(model)


def test_model_config_as_kwargs_round_trip():
    cfg = ModelConfig(vocab_size=11, context_length=9, d_model=8, num_layers=1, num_heads=2,
                      d_ff=12, rope_theta=500.0, attention="sdpa")
    kw = cfg.as_kwargs()
    assert kw == dict(vocab_size=11, context_length=9, d_model=8, num_layers=1, num_heads=2,
                      d_ff=12, rope_theta=500.0, attention="sdpa")
    model = TransformerLM(**kw)
    assert model.attention_name == "sdpa" and model.context_length == 9
    with pytest.raises(Exception):
        cfg.d_model = 16  # frozen


def test_resolve_preset():
    assert resolve_preset("small") is PRESETS["small"]
    with pytest.raises(ValueError) as info:
        resolve_preset("huge")
    assert "'huge'" in str(info.value)
    for name in EDITIONS["2026"]:  # the default edition's names
        assert name in str(info.value)
