"""ProfileSpec: the frozen identity of one `lmperf profile` job (a RunSpec, a backend, and where
the trace goes)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from lmperf.errors import SpecError
from lmperf.validate import choice
from lmperf.workload.spec import RunSpec

BACKENDS: tuple[str, ...] = ("torch", "nsys")


@dataclass(frozen=True)
class ProfileSpec(RunSpec):
    """One profile: the workload of a RunSpec (same fields, same checks) under a profiler.

    Attributes (besides RunSpec's):
        backend: 'torch' (torch.profiler, CPU and CUDA) or 'nsys' (Nsight Systems).
        top: rows of each top-operators/kernels table.
        trace: where the trace is written (torch: a Chrome trace .json; nsys: the report's
            base name); resolved by the plan, so the job (maybe in a child) needs no default.

    `to_dict()` holds every field (it is what a child process rebuilds the job from); the
    records carry `record_spec()`, the run's spec plus the backend, as they always have.
    """

    kind: ClassVar[str] = "profile"
    runner: ClassVar[str] = "lmperf.questions.profile.job:run_profile"

    backend: str = "torch"
    top: int = 10
    trace: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        choice("backend", self.backend, BACKENDS)
        if isinstance(self.top, bool) or not isinstance(self.top, int) or self.top <= 0:
            raise SpecError(f"--top must be a positive integer, got {self.top!r}")

    @classmethod
    def from_run(cls, run: RunSpec, **extra: object) -> "ProfileSpec":
        """A ProfileSpec with the fields of `run` and the profile's own `extra` fields."""
        return cls(**{f.name: getattr(run, f.name) for f in fields(RunSpec)}, **extra)

    def workload(self) -> RunSpec:
        """The RunSpec being profiled (what the capture and the Nsight child run)."""
        return RunSpec(**{f.name: getattr(self, f.name) for f in fields(RunSpec)})

    def record_spec(self) -> dict:
        """The `spec` of this job's records: the run's spec dict plus the backend."""
        return self.workload().to_dict() | {"backend": self.backend}

    def label(self) -> str:
        """The run's label, with the backend when it is not torch.profiler."""
        return super().label() + ("" if self.backend == "torch" else f" ({self.backend})")
