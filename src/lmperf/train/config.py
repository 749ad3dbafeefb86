"""TrainConfig: everything one `lmperf train` run is, checked on construction; device defaults."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

from lmperf.errors import SpecError
from lmperf.validate import positive_int
from lmperf.model.attention import ATTENTION
from lmperf.model.presets import PRESETS, ModelConfig
from lmperf.runtime.precision import REGIMES

# Sized so that `lmperf train` with no arguments ends well inside two minutes on the project's
# 2-core CPU machine (measured: see the README), with a loss that is still falling at the end.
# One intra-op thread on the CPU: the tiny model's steps take ~1.4x longer than with two on an
# idle machine, but two threads stall (single steps of 1-2 s instead of 20 ms) as soon as another
# process competes for the cores, which would break the time budget on a shared machine.
CPU_DEFAULTS: dict = {"regimes": ("fp32", "bf16-mixed", "bf16-true"), "size": "tiny",
                      "context": 64, "batch": 16, "steps": 200, "threads": 1}
# On a GPU fp16 is fast, so the default adds the fp16 regimes (with and without loss scaling).
CUDA_DEFAULTS: dict = {"regimes": ("fp32", "bf16-mixed", "bf16-true", "fp16-mixed",
                                   "fp16-mixed-noscale", "fp16-true"),
                       "size": "mini", "context": 256, "batch": 32, "steps": 500, "threads": None}


@dataclass(frozen=True)
class TrainConfig:
    """One training comparison: the model, data shape, optimiser, schedule and stop rules.

    Attributes:
        regimes: precision regimes to train, in order (names from REGIMES).
        size: the preset that gave the shape (d_model, num_layers, num_heads, d_ff).
        vocab_size: ids the model accepts; 256 covers byte-level data.
        context: sequence length T of every window; batch: windows per step (B).
        steps: optimiser steps per regime.
        lr: peak learning rate of AdamW; warmup_steps: linear warm-up from lr/warmup_steps;
            then cosine decay to lr * min_lr_ratio at the last step.
        weight_decay, beta1, beta2, eps: AdamW's settings (eps is in the parameter dtype's
            arithmetic in the -true regimes, which is part of what they show).
        clip: max gradient norm after unscaling (0: no clipping; the norm is still recorded).
        eval_interval: steps between validation losses (also at step 0 and the last step);
            eval_batches: fixed validation batches averaged per evaluation.
        seed: seeds the weights, the training windows and (seed + 1) the validation windows.
        device: 'cpu' or 'cuda' (resolved); attention: the reference LM's attention.
        diverge_factor: a regime is 'diverged' when its loss exceeds this multiple of its
            first-step loss (worse than where it started from random weights) ...
        diverge_bad_grads: ... or when the gradient norm is non-finite this many steps in a row
            (with loss scaling: the scaler skipped every one and could not find a finite scale).
    """

    regimes: tuple[str, ...]
    size: str
    d_model: int
    num_layers: int
    num_heads: int
    d_ff: int
    vocab_size: int = 256
    context: int = 64
    batch: int = 16
    steps: int = 200
    lr: float = 3e-3
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    clip: float = 1.0
    eval_interval: int = 50
    eval_batches: int = 8
    seed: int = 0
    device: str = "cpu"
    attention: str = "naive"
    diverge_factor: float = 2.0
    diverge_bad_grads: int = 25
    data: dict = field(default_factory=dict, compare=False)  # Corpus.describe(), for the record

    def __post_init__(self) -> None:
        if not self.regimes:
            raise SpecError("give at least one --regime")
        for name in self.regimes:
            if name not in REGIMES:
                raise SpecError(f"unknown regime {name!r}; accepted: {', '.join(REGIMES)}")
        if len(set(self.regimes)) != len(self.regimes):
            raise SpecError(f"a regime is listed twice: {' '.join(self.regimes)}")
        if self.attention not in ATTENTION:
            raise SpecError(f"unknown attention {self.attention!r}; accepted: {', '.join(ATTENTION)}")
        for name in ("d_model", "num_layers", "num_heads", "d_ff", "vocab_size", "context",
                     "batch", "steps", "eval_interval", "eval_batches", "diverge_bad_grads"):
            positive_int(f"--{name.replace('_', '-')}", getattr(self, name))
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) \
                or self.warmup_steps < 0:
            raise SpecError(f"--warmup-steps must be a non-negative integer, got {self.warmup_steps!r}")
        for name, value in (("--lr", self.lr), ("--eps", self.eps), ("diverge_factor", self.diverge_factor)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise SpecError(f"{name} must be a positive number, got {value!r}")
        if not (math.isfinite(self.clip) and self.clip >= 0):
            raise SpecError(f"--clip must be >= 0 (0: no clipping), got {self.clip!r}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise SpecError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio!r}")
        if not (0 <= self.weight_decay and 0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise SpecError("weight decay must be >= 0 and the AdamW betas in [0, 1)")
        if self.d_model % self.num_heads or (self.d_model // self.num_heads) % 2:
            raise SpecError(f"d_model {self.d_model} must split into {self.num_heads} heads of an "
                            "even width (RoPE rotates pairs)")
        if self.seed < 0:
            raise SpecError(f"--seed must be >= 0, got {self.seed}")

    @classmethod
    def from_size(cls, size: str, regimes: tuple[str, ...] | list[str], **kwargs: object) -> "TrainConfig":
        """A config with the shape of preset `size`; SpecError for an unknown size."""
        if size not in PRESETS:
            raise SpecError(f"unknown size {size!r}; accepted: {', '.join(PRESETS)}")
        p = PRESETS[size]
        return cls(regimes=tuple(regimes), size=size, d_model=p.d_model, num_layers=p.num_layers,
                   num_heads=p.num_heads, d_ff=p.d_ff, **kwargs)  # type: ignore[arg-type]

    def model_config(self) -> ModelConfig:
        """The reference LM's configuration (its context length is the training context)."""
        return ModelConfig(vocab_size=self.vocab_size, context_length=self.context,
                           d_model=self.d_model, num_layers=self.num_layers,
                           num_heads=self.num_heads, d_ff=self.d_ff, attention=self.attention)

    def lr_at(self, step: int) -> float:
        """Learning rate of step `step` (1-based): linear warm-up, then cosine to lr*min_lr_ratio."""
        if step <= self.warmup_steps:
            return self.lr * step / self.warmup_steps
        # the first step after warm-up is at the peak, the last one at the floor
        span = max(1, self.steps - self.warmup_steps - 1)
        progress = min(1.0, (step - self.warmup_steps - 1) / span)
        floor = self.lr * self.min_lr_ratio
        return floor + (self.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    def spec(self, regime: str) -> dict:
        """The record's spec for one regime: every setting, the data facts, and the regime."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("regimes", "data")}
        return {"regime": regime, **out, "optimizer": "AdamW", "data": dict(self.data)}

    def as_dict(self) -> dict:
        """All fields, JSON-ready."""
        d = asdict(self)
        d["regimes"] = list(self.regimes)
        return d
