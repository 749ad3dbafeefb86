"""The reference Transformer LM, its attention implementations and size presets."""

from lmperf.model.attention import ATTENTION, make_attention
from lmperf.model.custom import build_model, count_params, inspect_on_meta, load_factory
from lmperf.model.presets import COURSE_SIZES, PRESETS, VOCAB_SIZE, ModelConfig, Preset
from lmperf.model.transformer import TransformerLM

__all__ = [
    "ATTENTION", "COURSE_SIZES", "PRESETS", "VOCAB_SIZE", "ModelConfig", "Preset",
    "TransformerLM", "build_model", "count_params", "inspect_on_meta", "load_factory",
    "make_attention",
]
