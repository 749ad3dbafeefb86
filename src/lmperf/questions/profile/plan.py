"""From `lmperf profile`'s options to one checked ProfileSpec, before anything runs.

Bad input is found here (unknown names, non-positive numbers, a user model that cannot be built,
a bad trace path), so that it is one line and exit code 2, never a job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from lmperf.core.vocabulary import MODEL_SIZE, device_defaults, resolve_threads
from lmperf.errors import SpecError
from lmperf.results.store import ensure_folder
from lmperf.model.presets import DEFAULT_COURSE
from lmperf.questions.profile.spec import ProfileSpec
from lmperf.runtime import device as dev
from lmperf.runtime.precision import precision_warnings
from lmperf.workload.build import check_user_models, resolve_optimizer
from lmperf.workload.spec import RunSpec

DEFAULT_TRACE_DIR = Path("results") / "traces"


@dataclass
class ProfilePlan:
    """The job of a profile and what to tell the user before it starts."""

    spec: ProfileSpec
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def default_trace(run: RunSpec, out: str | Path | None = None) -> Path:
    """traces/<the run's label, spaces as underscores, '=' dropped>.json beside the results file
    `out` (so a run with --out elsewhere writes nothing into the working directory), or under
    results/ when the record stays in memory (out None)."""
    folder = Path(out).parent / DEFAULT_TRACE_DIR.name if out is not None else DEFAULT_TRACE_DIR
    return folder / (run.label().replace(" ", "_").replace("=", "") + ".json")


def _one(name: str, value: object) -> object:
    # A profile is one run: a list of values (the API accepts the bench-style keywords) is
    # refused rather than silently profiling its first entry.
    if isinstance(value, (list, tuple)):
        if len(value) != 1:
            raise SpecError(f"{name}: a profile is one run; give one value, got {list(value)}")
        return value[0]
    return value


def plan_profile(*, size: str | None = None, model: str | None = None,
                 context: int | None = None, batch: int = 4, precision: str | None = None,
                 mode: str = "train-step", attention: str = "naive", warmup: int = 2,
                 steps: int = 10, seed: int = 0, optimizer: str = "auto", device: str = "auto",
                 threads: int | None = None, model_context: int = 0,
                 top: int = 10, trace: str | Path | None = None, out: str | Path | None = None,
                 course: str = DEFAULT_COURSE, compile: bool = False,
                 compile_mode: str = "default") -> ProfilePlan:
    """The checked ProfileSpec of `lmperf profile` (keywords as its flags).

    None takes the device's default (core.vocabulary.DEFAULTS["profile"]); with `model` and no
    `size`, the default size gives the one shape the user's factory receives. `trace` None:
    traces/<run>.json beside `out` (the results file; None: results/traces/<run>.json).
    Raises SpecError or ModelLoadError.
    """
    dev_ = dev.resolve_device(device)
    defaults = device_defaults("profile", dev_.type, course)
    values = {name: _one(name, v) for name, v in
              dict(size=size, context=context, batch=batch, precision=precision, mode=mode,
                   attention=attention, warmup=warmup).items()}
    run = RunSpec.from_size(
        values["size"] or (MODEL_SIZE if model else defaults["size"]), course, context=values["context"] or defaults["context"],
        model_context=model_context, batch=values["batch"],
        precision=values["precision"] or defaults["precision"], mode=values["mode"],
        attention=values["attention"], optimizer=resolve_optimizer(optimizer, dev_),
        warmup=values["warmup"], steps=steps, seed=seed, device=dev_.type, model=model,
        threads=resolve_threads(threads, dev_.type), compile=compile, compile_mode=compile_mode)
    spec = ProfileSpec.from_run(run, top=top,
                                trace=str(trace if trace is not None else default_trace(run, out)))
    ensure_folder(Path(spec.trace).parent, "trace folder")  # a bad path fails before the run
    plan = ProfilePlan(spec)
    if model:
        check_user_models([run])
        plan.notes.append(f"model {model}: its factory receives the shape of {run.size} "
                          f"({run.shape()})")
    plan.warnings += precision_warnings([run.precision], dev_)
    return plan
