"""From a request (lists per axis, device defaults) to checked RunSpecs, before anything runs.

Everything that can be wrong with the input is found here, so that a bad request exits with one
line before the first child starts: unknown names, non-positive numbers, a context longer than
the model allows, a user model that cannot be imported or returns the wrong shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from lmperf.core.vocabulary import (
    MODEL_SIZE, as_list, device_defaults, model_shape_note, resolve_threads,
)
from lmperf.model.presets import DEFAULT_COURSE
from lmperf.runtime import device as dev
from lmperf.runtime.precision import default_regimes, precision_warnings, require_float8
from lmperf.workload.build import check_user_models, resolve_optimizer
from lmperf.workload.spec import Grid, RunSpec


@dataclass
class Plan:
    """The specs of a sweep and what to tell the user before it starts."""

    specs: list[RunSpec]
    device_name: str
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


# How a command line names the reference LM among several --model values (an A/B sweep).
REFERENCE_WORDS: tuple[str, ...] = ("none", "reference")


def models_of(model: Sequence[str | None] | str | None) -> list[str | None]:
    """The --model values of a sweep: None or "none"/"reference" is the reference LM, anything
    else a factory ('package.module:factory'); duplicates run once."""
    values = [model] if model is None or isinstance(model, str) else list(model)
    return list(dict.fromkeys(None if v is None or str(v).lower() in REFERENCE_WORDS else str(v)
                              for v in values)) or [None]


def plan_bench(*, size: Sequence[str] | str | None = None,
               model: Sequence[str | None] | str | None = None,
               context: Sequence[int] | int | None = None, batch: Sequence[int] | int = 4,
               precision: Sequence[str] | str | None = None,
               mode: Sequence[str] | str = "train-step",
               attention: Sequence[str] | str = "naive", warmup: Sequence[int] | int = 5,
               steps: int = 10, seed: int = 0, optimizer: str = "auto", device: str = "auto",
               threads: int | None = None, model_context: int = 0, clip: float = 1.0,
               course: str = DEFAULT_COURSE, compile: Sequence[bool] | bool = False,
               compile_mode: str = "default",
               checkpoint: Sequence[str | int] | str | int = "none", grad_accum: int = 1,
               float8: Sequence[str] | str = "none", vocab_size: int | None = None,
               command: str = "bench") -> Plan:
    """Build and check the sweep of `lmperf bench` (keywords as its flags; lists sweep).

    Values left None take the device's defaults (core.vocabulary.DEFAULTS; on CUDA the
    `course` edition's sweep). Size names mean the shapes of the `course` edition. With `model`
    and no `size`, the factory gets core.vocabulary.MODEL_SIZE's shape, as in every command. Raises SpecError, or ModelLoadError for a
    user model that cannot be built or returns the wrong shape, or (SpecError) float8 that this
    device cannot run (`float8_unsupported_reason`). `command`: whose DEFAULTS apply (profile
    plans its one run here).
    """
    dev_ = dev.resolve_device(device)
    defaults = {k: as_list(v) for k, v in device_defaults(command, dev_.type, course).items()}
    models = models_of(model)
    user = [m for m in models if m is not None]
    sizes = as_list(size) or ([MODEL_SIZE] if user else defaults["size"])
    # Default regimes too slow on this CPU (bf16 without native support) are left out, saying so.
    given = as_list(precision)
    precisions, left_out = (given, []) if given else default_regimes(defaults["precision"], dev_)
    fixed = dict(model_context=model_context,
                 optimizer=resolve_optimizer(optimizer, dev_), steps=steps, seed=seed,
                 device=dev_.type, threads=resolve_threads(threads, dev_.type),
                 clip=clip, course=course, compile_mode=compile_mode, grad_accum=grad_accum)
    if vocab_size is not None:  # else a preset's own or the course's 10,000
        fixed["vocab_size"] = vocab_size
    grid = Grid(sizes=sizes, contexts=as_list(context) or defaults["context"],
                batches=as_list(batch), precisions=precisions,
                modes=as_list(mode), attentions=as_list(attention), warmups=as_list(warmup),
                compiles=as_list(compile), checkpoints=as_list(checkpoint),
                float8s=as_list(float8), fixed=fixed)
    # Several --model values are the outermost axis (an A/B sweep: with --rounds, the sides
    # alternate run by run, so both see the same load).
    specs = list(dict.fromkeys(s.with_(model=m) for m in models for s in grid.expand()))
    require_float8({s.float8 for s in specs}, dev_)
    plan = Plan(specs=specs, device_name=dev.device_name(dev_), notes=left_out)
    for m in user:
        check_user_models([s for s in specs if s.model == m])
        for size_, shape in dict.fromkeys((s.size, s.shape()) for s in specs if s.model == m):
            plan.notes.append(model_shape_note(m, shape, size_))
    plan.warnings += precision_warnings((s.precision for s in specs), dev_)
    return plan

