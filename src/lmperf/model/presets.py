"""Model size presets and the resolved model configuration a factory receives."""

from __future__ import annotations

from dataclasses import asdict, dataclass

VOCAB_SIZE = 10_000  # the course's BPE vocabulary


@dataclass(frozen=True)
class Preset:
    """A model shape: width, feed-forward width, depth and heads."""

    d_model: int
    d_ff: int
    num_layers: int
    num_heads: int


# The course's sizes (CS336 Assignment 2, Table 1) plus CPU-sized ones for quick runs here.
PRESETS: dict[str, Preset] = {
    "tiny": Preset(d_model=64, d_ff=256, num_layers=2, num_heads=4),
    "mini": Preset(d_model=128, d_ff=512, num_layers=4, num_heads=4),
    "micro": Preset(d_model=256, d_ff=1024, num_layers=4, num_heads=4),
    "small": Preset(d_model=768, d_ff=3072, num_layers=12, num_heads=12),
    "medium": Preset(d_model=1024, d_ff=4096, num_layers=24, num_heads=16),
    "large": Preset(d_model=1280, d_ff=5120, num_layers=36, num_heads=20),
    "xl": Preset(d_model=1600, d_ff=6400, num_layers=48, num_heads=25),
    "2.7B": Preset(d_model=2560, d_ff=10240, num_layers=32, num_heads=32),
    "10B": Preset(d_model=4608, d_ff=12288, num_layers=50, num_heads=36),
}
COURSE_SIZES: tuple[str, ...] = ("small", "medium", "large", "xl", "2.7B")


@dataclass(frozen=True)
class ModelConfig:
    """Everything needed to build a model: what a user's factory receives.

    Attributes:
        vocab_size: number of token ids; logits have this many columns.
        context_length: the longest sequence the model must accept (RoPE table size).
        d_model, num_layers, num_heads, d_ff: the shape (from a preset or given explicitly).
        rope_theta: RoPE base.
        attention: attention implementation name (the reference model's `attention=` argument).
    """

    vocab_size: int
    context_length: int
    d_model: int
    num_layers: int
    num_heads: int
    d_ff: int
    rope_theta: float = 10000.0
    attention: str = "naive"

    def as_kwargs(self) -> dict:
        """Keyword arguments for `TransformerLM(**...)`."""
        return asdict(self)


def resolve_preset(name: str) -> Preset:
    """Look a preset up by name; raises ValueError listing the accepted names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown size {name!r}; accepted: {', '.join(PRESETS)}") from None
