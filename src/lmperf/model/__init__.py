"""The reference Transformer LM, its attention implementations and size presets.

The presets (and ModelConfig, what a user's factory receives) load without torch; the model
and its helpers are imported on first use, so the command line's help and checks stay fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lmperf.model.presets import (
    COURSE_SIZES, COURSE_TABLE, COURSES, DEFAULT_COURSE, EDITIONS, PRESETS, VOCAB_SIZE, ModelConfig,
    Preset, resolve_preset,
)

if TYPE_CHECKING:
    from lmperf.model.attention import ATTENTION, make_attention
    from lmperf.model.checks import count_params, inspect_on_meta
    from lmperf.model.custom import build_model, load_factory
    from lmperf.model.transformer import TransformerLM

# name -> the module that defines it (imported, with torch, on first access)
_LAZY: dict[str, str] = {
    "ATTENTION": "lmperf.model.attention", "make_attention": "lmperf.model.attention",
    "build_model": "lmperf.model.custom", "count_params": "lmperf.model.checks",
    "inspect_on_meta": "lmperf.model.checks", "load_factory": "lmperf.model.custom",
    "TransformerLM": "lmperf.model.transformer",
}

__all__ = [
    "ATTENTION", "COURSES", "COURSE_SIZES", "COURSE_TABLE", "DEFAULT_COURSE", "EDITIONS", "PRESETS",
    "VOCAB_SIZE", "ModelConfig", "Preset", "resolve_preset",
    "TransformerLM", "build_model", "count_params", "inspect_on_meta", "load_factory",
    "make_attention",
]


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lmperf.model' has no attribute {name!r}")
