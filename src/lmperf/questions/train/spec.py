"""TrainSpec: the frozen identity of one training job (one precision regime), checked on
construction; its learning-rate schedule and the model it trains."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from lmperf.errors import SpecError
from lmperf.model.attention import ATTENTION
from lmperf.model.presets import DEFAULT_COURSE, ModelConfig
from lmperf.model.shape import Compiled, ModelShape, OnDevice
from lmperf.results.schema import SpecDict
from lmperf.runtime.precision import REGIMES
from lmperf.validate import as_flag, check_fields, check_float8


@dataclass(frozen=True, kw_only=True)
class AdamWSchedule:
    """AdamW's settings and the learning-rate schedule of a training run.

    Attributes:
        lr: peak learning rate; lr_warmup: steps of linear warm-up from lr / lr_warmup, then
            cosine decay to lr * min_lr_ratio at the last step (`TrainSpec.lr_at`).
        weight_decay, beta1, beta2, eps: AdamW's settings (eps is in the parameter dtype's
            arithmetic in the -true regimes, which is part of what they show).
        clip: max gradient norm after unscaling (0: no clipping; the norm is still recorded).
    """

    lr: float = 3e-3
    lr_warmup: int = 20
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    clip: float = 1.0

    def check_adamw(self) -> None:
        """SpecError, naming the flag, for a setting AdamW or the schedule cannot take."""
        for name, value in (("--lr", self.lr), ("--eps", self.eps)):
            if not _real(value) or not value > 0:
                raise SpecError(f"{name} must be a positive number, got {value!r}")
        if not _real(self.clip) or self.clip < 0:
            raise SpecError(f"--clip must be >= 0 (0: no clipping), got {self.clip!r}")
        if not _real(self.min_lr_ratio) or not 0 <= self.min_lr_ratio <= 1:
            raise SpecError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio!r}")
        if not (0 <= self.weight_decay and 0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise SpecError("weight decay must be >= 0 and the AdamW betas in [0, 1)")


@dataclass(frozen=True, kw_only=True)
class Watch:
    """How a training run is watched and judged.

    Attributes:
        eval_interval: steps between validation losses (also at step 0 and the last step);
            eval_batches: fixed validation batches averaged per evaluation.
        diverge_factor: a run is 'diverged' when its loss exceeds this multiple of its
            first-step loss (worse than where it started from random weights) ...
        diverge_bad_grads: ... or when the gradient norm is non-finite this many steps in a row
            (with loss scaling: the scaler skipped every one and could not find a finite scale).
    """

    eval_interval: int = 50
    eval_batches: int = 8
    diverge_factor: float = 2.0
    diverge_bad_grads: int = 25

    def check_watch(self) -> None:
        """SpecError for a non-positive interval, batch count, factor or streak."""
        check_fields(self, positive=("eval_interval", "eval_batches", "diverge_bad_grads"),
                     named=as_flag)
        if not _real(self.diverge_factor) or not self.diverge_factor > 0:
            raise SpecError(f"diverge_factor must be a positive number, got {self.diverge_factor!r}")


@dataclass(frozen=True)
class TrainSpec(SpecDict, AdamWSchedule, Watch, Compiled, OnDevice, ModelShape):
    """One training run of the reference LM under one precision regime.

    Every regime of one `lmperf train` shares everything but `precision`: the same seed gives
    the same initial weights and the same batches, so their curves differ only by the regime.

    Attributes:
        precision: the regime (a name from `lmperf.runtime.precision.REGIMES`).
        vocab_size: ids the model accepts; 256 covers byte-level data.
        context: sequence length T of every window; batch: windows per step (B).
        steps: optimizer steps (each one timed).
        data: a text file trained on byte-level, or None; tokens: a flat uint16 token file, or
            None; with neither, the bundled generated corpus. Loaded by the job itself.
        attention: the reference LM's attention.
        float8: torchao's float8 training of the Linear layers ('none', 'tensorwise',
            'rowwise'), beside a bf16 regime: its curve is read against that regime's.
        The rest, keyword-only, come from the bases (the seed gives the weights and the training
        windows, seed + 1 the validation windows; a compiled run's first step is compile_s).
    """

    kind: ClassVar[str] = "train"
    runner: ClassVar[str] = "lmperf.questions.train.job:run_train"
    old_defaults = {"course": "2025"}  # records written before editions: 2025's sizes

    precision: str
    vocab_size: int = 256
    context: int = 64
    batch: int = 16
    steps: int = 200
    data: str | None = None
    tokens: str | None = None
    attention: str = "naive"
    float8: str = "none"

    def __post_init__(self) -> None:
        self.check_shape()
        self.check_on_device()
        self.check_compiled()
        self.check_adamw()
        self.check_watch()
        check_fields(self, choices={"precision": REGIMES, "attention": ATTENTION},
                     positive=("vocab_size", "context", "batch", "steps"),
                     non_negative=("lr_warmup",), named=as_flag)
        check_float8(self.float8, self.precision)
        if self.d_model % self.num_heads or (self.d_model // self.num_heads) % 2:
            raise SpecError(f"d_model {self.d_model} must split into {self.num_heads} heads of an "
                            "even width (RoPE rotates pairs)")
        if self.data is not None and self.tokens is not None:
            raise SpecError("give either --data (a text file) or --tokens (a token file), not both")

    @classmethod
    def from_size(cls, size: str, precision: str, course: str = DEFAULT_COURSE,
                  **overrides: object) -> "TrainSpec":
        """A spec with the shape of `size` in the `course` edition's table (the vocabulary comes
        from the data, not the preset); SpecError for an unknown size."""
        from lmperf.model.presets import require_plain

        require_plain(size, course, "lmperf train")
        dims = cls.of_size(size, course)
        dims.pop("vocab_size", None)  # the vocabulary comes from the data
        return cls(precision=precision, size=size, course=course, **dims,
                   **overrides)  # type: ignore[arg-type]

    def model_config(self) -> ModelConfig:
        """The reference LM's configuration (its context length is the training context)."""
        return ModelConfig(vocab_size=self.vocab_size, context_length=self.context,
                           d_model=self.d_model, num_layers=self.num_layers,
                           num_heads=self.num_heads, d_ff=self.d_ff, attention=self.attention)

    def lr_at(self, step: int) -> float:
        """Learning rate of step `step` (1-based): linear warm-up, then cosine to lr*min_lr_ratio."""
        if step <= self.lr_warmup:
            return self.lr * step / self.lr_warmup
        # the first step after warm-up is at the peak, the last one at the floor
        span = max(1, self.steps - self.lr_warmup - 1)
        progress = min(1.0, (step - self.lr_warmup - 1) / span)
        floor = self.lr * self.min_lr_ratio
        return floor + (self.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    def label(self) -> str:
        """Short human-readable name for progress lines."""
        return (f"train {self.size} ctx={self.context} b={self.batch} {self.precision} "
                f"{self.steps} steps" + (" compiled" if self.compile else ""))


def _real(value: object) -> bool:
    """A finite int or float (bools refused)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def regime_label(precision: str, float8: str = "none") -> str:
    """How a train run's regime is named in tables, curves and findings: the precision, with
    ' + float8 <recipe>' after it for a float8 run."""
    return precision if float8 == "none" else f"{precision} + float8 {float8}"
