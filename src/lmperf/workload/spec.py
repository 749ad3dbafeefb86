"""RunSpec: the frozen identity of one run of the training workload (the `bench` job, and the
base of profile and memory jobs), and the expansion of a sweep grid."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from typing import ClassVar, Sequence

from lmperf.errors import SpecError
from lmperf.validate import (FLOAT8_REGIMES, check_fields, check_float8, checkpoint_policy,
                             positive_int)
from lmperf.kernels import NAMES as ATTENTION  # the one attention registry
from lmperf.names import MODES, OPTIMIZERS
from lmperf.model.presets import (DEFAULT_COURSE, PRESETS, VOCAB_SIZE, ModelConfig, model_extras,
                                  resolve_preset)
from lmperf.model.shape import DEVICES, Compiled, ModelShape, OnDevice
from lmperf.results.schema import SpecDict
from lmperf.runtime.precision import REGIMES


@dataclass(frozen=True)
class RunSpec(SpecDict, Compiled, OnDevice, ModelShape):
    """One benchmark run. Two runs with equal specs measure the same thing.

    `size` gives the shape, or with `model` (a user's 'package.module:factory') what its
    factory receives. `context` is the batch's T, `model_context` the model's maximum (RoPE
    table, >= T); `optimizer`: AdamW's 'fused', 'foreach' or 'loop' implementation;
    `num_kv_heads`: grouped-query attention's K/V heads (None: plain multi-head); `clip`: max
    gradient norm after unscaling (0: no unscale/clip step); `checkpoint`: the activation
    checkpointing policy, canonical ('none', 'full', 'op', 'every-K' or G blocks per group:
    `lmperf.validate.checkpoint_policy`; a transformers model: none or full); `float8`:
    torchao's float8 training of the Linear layers ('none', 'tensorwise', 'rowwise'; with a
    bf16 regime); `grad_accum`: micro-batches of `batch` sequences per optimizer step
    (train-step).
    """

    kind: ClassVar[str] = "bench"
    runner: ClassVar[str] = "lmperf.questions.bench.job:run_spec"
    old_defaults = {"course": "2025"}  # records written before editions: 2025's table

    # size, d_model, num_layers, num_heads, d_ff, course: ModelShape; device, threads, seed:
    # OnDevice; compile, compile_mode: Compiled
    context: int = 128
    model_context: int = 0  # 0: same as context (resolved in __post_init__)
    batch: int = 4
    precision: str = "fp32"
    mode: str = "train-step"
    attention: str = "naive"
    optimizer: str = "fused"
    warmup: int = 5
    steps: int = 10
    model: str | None = None
    vocab_size: int = VOCAB_SIZE
    rope_theta: float = 10000.0
    clip: float = 1.0
    num_kv_heads: int | None = None
    tie_embeddings: bool = False
    checkpoint: str | int = "none"
    grad_accum: int = 1
    float8: str = "none"

    def __post_init__(self) -> None:
        self.check_shape()
        self.check_on_device()
        self.check_compiled()
        check_fields(self, choices={"precision": REGIMES, "mode": MODES, "attention": ATTENTION,
                                    "optimizer": OPTIMIZERS},
                     positive=("context", "batch", "steps", "vocab_size", "grad_accum"),
                     non_negative=("warmup",))
        object.__setattr__(self, "checkpoint", checkpoint_policy(self.checkpoint))
        check_float8(self.float8, self.precision)
        if self.grad_accum > 1 and self.mode != "train-step":
            raise SpecError(f"gradient accumulation (grad_accum {self.grad_accum}) belongs to "
                            "a training step: mode train-step")
        if self.checkpoint != "none" and self.mode == "forward":
            raise SpecError(f"activation checkpointing (checkpoint {self.checkpoint}) saves "
                            "memory for backward: mode forward-backward or train-step")
        if (isinstance(self.clip, bool) or not isinstance(self.clip, (int, float))
                or not math.isfinite(self.clip) or self.clip < 0):
            raise SpecError(f"clip must be a non-negative number, got {self.clip!r}")
        if self.model_context == 0:
            object.__setattr__(self, "model_context", self.context)
        positive_int("model_context", self.model_context)
        if self.context > self.model_context:
            raise SpecError(f"context {self.context} is longer than the model allows "
                            f"(model context length {self.model_context})")
        if self.model is None and self.d_model % self.num_heads:
            raise SpecError(f"d_model {self.d_model} is not divisible by num_heads {self.num_heads}")
        if self.num_kv_heads is not None:
            positive_int("num_kv_heads", self.num_kv_heads)
            if self.num_heads % self.num_kv_heads:
                raise SpecError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads "
                                f"{self.num_kv_heads}")
        if not isinstance(self.tie_embeddings, bool):
            raise SpecError(f"tie_embeddings must be true or false, got {self.tie_embeddings!r}")

    @classmethod
    def from_size(cls, size: str, course: str = DEFAULT_COURSE, **overrides: object) -> "RunSpec":
        """A spec whose shape (and vocabulary, K/V heads, RoPE base and tying, for a preset that
        has its own) comes from `size` in the `course` edition's table; other fields from
        `overrides`."""
        dims = cls.of_size(size, course)  # SpecError for an unknown size
        extras = model_extras(resolve_preset(size, course))
        return cls(size=size, course=course, **{**dims, **extras, **overrides})

    def model_config(self) -> ModelConfig:
        """What the model builder (or a user's factory) receives."""
        return ModelConfig(vocab_size=self.vocab_size, context_length=self.model_context,
                           d_model=self.d_model, num_layers=self.num_layers,
                           num_heads=self.num_heads, d_ff=self.d_ff, rope_theta=self.rope_theta,
                           attention=self.attention, num_kv_heads=self.num_kv_heads,
                           tie_embeddings=self.tie_embeddings)

    def clip_norm(self) -> float | None:
        """The train step's clipping threshold (None: no unscale/clip step)."""
        return float(self.clip) if self.clip > 0 else None

    def shape(self) -> str:
        """The model shape that was run, e.g. 'd=768 L=12 H=12 ff=3072' (and the vocabulary
        when it is not the course's 10k, K/V heads of GQA, 'tied' embeddings)."""
        vocab = "" if self.vocab_size == VOCAB_SIZE else f" V={self.vocab_size}"
        kv = "" if self.num_kv_heads in (None, self.num_heads) else f" Hkv={self.num_kv_heads}"
        return self.dims() + vocab + kv + (" tied" if self.tie_embeddings else "")

    def label(self) -> str:
        """Short human-readable name for progress lines."""
        name = f"{self.model} ({self.shape()})" if self.model else self.size
        return (f"{name} ctx={self.context} b={self.batch} {self.precision} "
                f"{self.mode} {self.attention}" + (f" warmup={self.warmup}" if self.warmup != 5 else "")
                + (f" x{self.grad_accum}" if self.grad_accum > 1 else "")
                + (f" ckpt={self.checkpoint}" if self.checkpoint != "none" else "")
                + (f" float8 {self.float8}" if self.float8 != "none" else "")
                + (" compiled" if self.compile else ""))

    def with_(self, **changes: object) -> "RunSpec":
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)


@dataclass(frozen=True)
class Grid:
    """Lists of values to sweep; `expand` gives their cartesian product as RunSpecs.

    Fields that take one value (warmup, steps, ...) go in `fixed`.
    """

    sizes: Sequence[str]
    contexts: Sequence[int]
    batches: Sequence[int]
    precisions: Sequence[str]
    modes: Sequence[str]
    attentions: Sequence[str]
    warmups: Sequence[int] = (5,)
    compiles: Sequence[bool] = (False,)
    checkpoints: Sequence[str | int] = ("none",)
    float8s: Sequence[str] = ("none",)
    fixed: dict = field(default_factory=dict)

    def expand(self) -> list[RunSpec]:
        """Every combination, in size-major order (the order of the course's table). A forward
        has no backward to checkpoint for: with checkpoint none listed, it runs at none only
        (alone, `--mode forward --checkpoint full` is refused by RunSpec). Likewise float8
        trains beside a bf16 regime: with float8 none listed, the other regimes run at none
        only (alone, `--precision fp32 --float8 rowwise` is refused)."""
        policies = [checkpoint_policy(g) for g in self.checkpoints]
        return [
            RunSpec.from_size(size, context=ctx, batch=b, precision=p, mode=m,
                              attention=a, warmup=w, compile=c, checkpoint=g, float8=f,
                              **self.fixed)
            for size, ctx, b, p, m, a, w, c, g, f in itertools.product(
                self.sizes, self.contexts, self.batches, self.precisions, self.modes,
                self.attentions, self.warmups, self.compiles, dict.fromkeys(policies),
                dict.fromkeys(self.float8s))
            if not (m == "forward" and g != "none" and "none" in policies)
            and not (f != "none" and p not in FLOAT8_REGIMES and "none" in self.float8s)
        ]


__all__ = ["DEVICES", "Grid", "MODES", "OPTIMIZERS", "PRESETS", "RunSpec"]
