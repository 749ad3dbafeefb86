"""The reference Transformer LM, its attention implementations and size presets."""

from lmperf.model.attention import ATTENTION, make_attention
from lmperf.model.custom import build_model, count_params, inspect_on_meta, load_factory
from lmperf.model.presets import (
    COURSE_SIZES, COURSE_TABLE, COURSES, DEFAULT_COURSE, EDITIONS, PRESETS, VOCAB_SIZE, ModelConfig,
    Preset, resolve_preset,
)
from lmperf.model.transformer import TransformerLM

__all__ = [
    "ATTENTION", "COURSES", "COURSE_SIZES", "COURSE_TABLE", "DEFAULT_COURSE", "EDITIONS", "PRESETS",
    "VOCAB_SIZE", "ModelConfig", "Preset", "resolve_preset",
    "TransformerLM", "build_model", "count_params", "inspect_on_meta", "load_factory",
    "make_attention",
]
