"""ProfileSpec: the frozen identity of one `lmperf profile` job (a RunSpec, the size of its top
tables, and where the trace goes)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from lmperf.errors import SpecError
from lmperf.workload.spec import RunSpec


@dataclass(frozen=True)
class ProfileSpec(RunSpec):
    """One profile: the workload of a RunSpec (same fields, same checks) under torch.profiler.

    Attributes (besides RunSpec's):
        top: rows of each top-operators/kernels table.
        trace: where the Chrome trace (.json) is written; resolved by the plan, so the job
            (maybe in a child) needs no default.

    `to_dict()` holds every field (it is what a child process rebuilds the job from); the
    records carry `record_spec()`, the run's spec.
    """

    kind: ClassVar[str] = "profile"
    runner: ClassVar[str] = "lmperf.questions.profile.job:run_profile"

    top: int = 10
    trace: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.top, bool) or not isinstance(self.top, int) or self.top <= 0:
            raise SpecError(f"--top must be a positive integer, got {self.top!r}")

    @classmethod
    def from_run(cls, run: RunSpec, **extra: object) -> "ProfileSpec":
        """A ProfileSpec with the fields of `run` and the profile's own `extra` fields."""
        return cls(**{f.name: getattr(run, f.name) for f in fields(RunSpec)}, **extra)

    def workload(self) -> RunSpec:
        """The RunSpec being profiled."""
        return RunSpec(**{f.name: getattr(self, f.name) for f in fields(RunSpec)})

    def record_spec(self) -> dict:
        """The `spec` of this job's records: the run's spec dict."""
        return self.workload().to_dict()
