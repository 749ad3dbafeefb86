"""Model size presets and the resolved model configuration a factory receives."""

from __future__ import annotations

from dataclasses import asdict, dataclass

VOCAB_SIZE = 10_000  # the course's BPE vocabulary


@dataclass(frozen=True)
class Preset:
    """A model shape: width, feed-forward width, depth and heads (and a vocabulary when the
    preset has its own; None: the course's 10k BPE vocabulary). `num_kv_heads` None is plain
    multi-head attention (as many K/V heads as query heads); `rope_theta` None is RoPE's 10000;
    `tie_embeddings` makes lm_head share the embedding's weight."""

    d_model: int
    d_ff: int
    num_layers: int
    num_heads: int
    vocab_size: int | None = None
    num_kv_heads: int | None = None
    rope_theta: float | None = None
    tie_embeddings: bool = False


# Sizes for quick runs on a CPU, the same in every edition.
_CPU_SIZES: dict[str, Preset] = {
    "tiny": Preset(d_model=64, d_ff=256, num_layers=2, num_heads=4),
    "mini": Preset(d_model=128, d_ff=512, num_layers=4, num_heads=4),
    "micro": Preset(d_model=256, d_ff=1024, num_layers=4, num_heads=4),
}
_SMALL_TO_LARGE: dict[str, Preset] = {
    "small": Preset(d_model=768, d_ff=3072, num_layers=12, num_heads=12),
    "medium": Preset(d_model=1024, d_ff=4096, num_layers=24, num_heads=16),
    "large": Preset(d_model=1280, d_ff=5120, num_layers=36, num_heads=20),
}
_SHAPE_2P7B = Preset(d_model=2560, d_ff=10240, num_layers=32, num_heads=32)
_SHAPE_10B = Preset(d_model=4608, d_ff=12288, num_layers=50, num_heads=36)
# Llama 3 shapes, from each model's config.json on huggingface.co/meta-llama (Llama-3.2-1B,
# Llama-3.2-3B, Llama-3.1-8B, Llama-3.1-70B, Llama-3.1-405B): grouped-query attention with 8 K/V
# heads, vocabulary
# 128,256, RoPE base 500,000 (their "llama3" RoPE frequency scaling is not modelled: it changes
# values, not costs); the 3.2 models tie lm_head to the embedding. Published parameter counts:
# 1.24B, 3.21B, 8.03B, 70.6B, 405.9B (tests/model/test_llama_presets.py pins them). They accept any
# context (the reference LM's RoPE table is sized to the run's); Llama 3.1's is 131,072.
_LLAMA3: dict[str, Preset] = {
    name: Preset(d_model=d, d_ff=f, num_layers=n, num_heads=h, vocab_size=128_256,
                 num_kv_heads=8, rope_theta=500_000.0, tie_embeddings=tied)
    for name, d, f, n, h, tied in (("llama3-1b", 2048, 8192, 16, 32, True),
                                   ("llama3-3b", 3072, 8192, 28, 24, True),
                                   ("llama3-8b", 4096, 14336, 32, 32, False),
                                   ("llama3-70b", 8192, 28672, 80, 64, False),
                                   ("llama3-405b", 16384, 53248, 126, 128, False))
}

# What the size names mean in each edition of CS336 Assignment 2 (the handout's table of model
# sizes). 2025: small..2.7B (xl = 1600 wide, 48 layers); 2026 (course release 26.1.1): xl is
# 2025's 2.7B shape, 2.7B is gone, 10B is in the table, and the leaderboard's model is a preset
# (Qwen-like vocabulary of 151,936; the leaderboard runs it at context 32,768, batch 2, bf16).
EDITIONS: dict[str, dict[str, Preset]] = {
    "2025": {**_CPU_SIZES, **_SMALL_TO_LARGE,
             "xl": Preset(d_model=1600, d_ff=6400, num_layers=48, num_heads=25),
             "2.7B": _SHAPE_2P7B, "10B": _SHAPE_10B, **_LLAMA3},
    "2026": {**_CPU_SIZES, **_SMALL_TO_LARGE, "xl": _SHAPE_2P7B, "10B": _SHAPE_10B,
             "leaderboard": Preset(d_model=4096, d_ff=11008, num_layers=34, num_heads=32,
                                   vocab_size=151_936), **_LLAMA3},
}
# The edition a size name means when none is given: the current one. Records written before
# editions existed were 2025's (`RunSpec.from_dict` reads a missing `course` as "2025").
DEFAULT_COURSE = "2026"
COURSES: tuple[str, ...] = tuple(EDITIONS)
# The sizes of each edition's benchmarking table, in its order.
COURSE_TABLE: dict[str, tuple[str, ...]] = {
    "2025": ("small", "medium", "large", "xl", "2.7B"),
    "2026": ("small", "medium", "large", "xl", "10B"),
}

# Every name any edition knows (for help texts); a name's shape depends on the edition.
PRESETS: dict[str, Preset] = {**EDITIONS["2025"], **EDITIONS[DEFAULT_COURSE]}
COURSE_SIZES: tuple[str, ...] = COURSE_TABLE["2025"]  # kept for older imports: 2025's table


@dataclass(frozen=True)
class ModelConfig:
    """Everything needed to build a model: what a user's factory receives.

    Attributes:
        vocab_size: number of token ids; logits have this many columns.
        context_length: the longest sequence the model must accept (RoPE table size).
        d_model, num_layers, num_heads, d_ff: the shape (from a preset or given explicitly).
        rope_theta: RoPE base.
        attention: attention implementation name (the reference model's `attention=` argument).
        num_kv_heads: K/V heads of grouped-query attention (None: num_heads, plain multi-head).
        tie_embeddings: lm_head shares the token embedding's weight.
    """

    vocab_size: int
    context_length: int
    d_model: int
    num_layers: int
    num_heads: int
    d_ff: int
    rope_theta: float = 10000.0
    attention: str = "naive"
    num_kv_heads: int | None = None
    tie_embeddings: bool = False

    def as_kwargs(self) -> dict:
        """Keyword arguments for `TransformerLM(**...)`; the GQA / tying fields only when set,
        so a factory written before them still takes `Model(**config.as_kwargs())`."""
        kwargs = asdict(self)
        for name, off in (("num_kv_heads", None), ("tie_embeddings", False)):
            if kwargs[name] == off:
                del kwargs[name]
        return kwargs


def model_extras(preset: Preset) -> dict[str, object]:
    """What `preset` sets beyond the course's model (K/V heads, RoPE base, tying), as keyword
    arguments of a RunSpec or ModelConfig; {} for the course's sizes."""
    return {k: v for k in ("num_kv_heads", "rope_theta", "tie_embeddings")
            if (v := getattr(preset, k)) not in (None, False)}


def resolve_preset(name: str, course: str = DEFAULT_COURSE) -> Preset:
    """Look a size up in an edition of the course; raises ValueError naming the accepted names
    (and the edition that has `name`, if another one does)."""
    if course not in EDITIONS:
        raise ValueError(f"unknown course edition {course!r}; accepted: {', '.join(COURSES)}")
    sizes = EDITIONS[course]
    if name in sizes:
        return sizes[name]
    elsewhere = [c for c, table in EDITIONS.items() if name in table]
    hint = f" (it is a size of the {elsewhere[0]} edition: --course {elsewhere[0]})" if elsewhere else ""
    raise ValueError(f"unknown size {name!r} in the {course} edition{hint}; accepted: "
                     f"{', '.join(sizes)}")


def require_plain(size: str, course: str, command: str) -> None:
    """SpecError when `size` has grouped-query attention or tied embeddings, which `command`
    does not build yet (it would train a different model than the preset names)."""
    from lmperf.errors import SpecError

    preset = EDITIONS.get(course, {}).get(size)
    if preset is not None and (preset.num_kv_heads or preset.tie_embeddings):
        raise SpecError(f"--size {size}: {command} builds the reference LM without grouped-query "
                        "attention or tied embeddings yet; bench, profile, memory and plan run it")
