"""From `lmperf profile`'s options to one checked ProfileSpec, before anything runs.

Bad input is found here (unknown names, non-positive numbers, a user model that cannot be built,
a bad trace path), so that it is one line and exit code 2, never a job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from lmperf.errors import SpecError
from lmperf.results.store import ensure_folder
from lmperf.model.presets import DEFAULT_COURSE
from lmperf.questions.bench.plan import plan_bench
from lmperf.questions.profile.spec import ProfileSpec
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


def plan_profile(*, size: str | None = None, model: str | None = None,
                 context: int | None = None, batch: int = 4, precision: str | None = None,
                 mode: str = "train-step", attention: str = "naive", warmup: int = 2,
                 steps: int = 10, seed: int = 0, optimizer: str = "auto", device: str = "auto",
                 threads: int | None = None, model_context: int = 0,
                 top: int = 10, trace: str | Path | None = None, out: str | Path | None = None,
                 course: str = DEFAULT_COURSE, compile: bool = False,
                 compile_mode: str = "default") -> ProfilePlan:
    """The checked ProfileSpec of `lmperf profile` (keywords as its flags).

    Planned as bench's one run (`plan_bench`, with core.vocabulary.DEFAULTS["profile"] for
    None); options that name several runs are refused. `trace` None: traces/<run>.json beside
    `out` (the results file; None: results/traces/<run>.json). Raises SpecError or
    ModelLoadError.
    """
    for name, value in dict(size=size, context=context, batch=batch, precision=precision,
                            mode=mode, attention=attention, warmup=warmup).items():
        if isinstance(value, (list, tuple)) and len(value) != 1:  # the API's bench keywords
            raise SpecError(f"{name}: a profile is one run; give one value, got {list(value)}")
    bench = plan_bench(size=size, model=model, context=context, batch=batch,
                       precision=precision, mode=mode, attention=attention, warmup=warmup,
                       steps=steps, seed=seed, optimizer=optimizer, device=device,
                       threads=threads, model_context=model_context, course=course,
                       compile=compile, compile_mode=compile_mode, command="profile")
    if len(bench.specs) != 1:
        raise SpecError(f"a profile is one run; give one value per option, got "
                        f"{len(bench.specs)} runs")
    run = bench.specs[0]
    spec = ProfileSpec.from_run(run, top=top,
                                trace=str(trace if trace is not None else default_trace(run, out)))
    ensure_folder(Path(spec.trace).parent, "trace folder")  # a bad path fails before the run
    return ProfilePlan(spec, bench.notes, bench.warnings)
