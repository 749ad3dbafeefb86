"""MemorySpec: one `lmperf memory` job, the unit the launcher runs in its own process.

A job is one analysis of one precision: the per-phase peaks over every (context, mode) on one
model ('phases'), the saved-tensor accounting over every context ('saved'), or the activation
checkpointing trade-off over group sizes at one context ('checkpoint'). A context that runs out
of memory inside a job is an 'oom' row of that job; a job whose process dies is one 'error' row.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from lmperf.errors import SpecError
from lmperf.validate import checkpoint_policy, choice, positive_int
from lmperf.workload.spec import MODES, RunSpec

ANALYSES: tuple[str, ...] = ("phases", "saved", "checkpoint")


@dataclass(frozen=True)
class MemorySpec(RunSpec):
    """What one memory job measures: the run of a RunSpec (same fields, same checks; its context
    length is the longest of `contexts`: the model is built for it and shorter contexts cut the
    batch) and the job's own fields.

    Attributes (besides RunSpec's):
        analysis: 'phases', 'saved' or 'checkpoint'.
        contexts: the context lengths measured, ascending.
        modes: the steps of the phases analysis ('forward', 'train-step', ...).
        groups: checkpointing policies, canonical (lmperf.validate.checkpoint_policy; 'none'
            is always measured first).
        top: rows of the largest saved activations kept in a 'saved' record.

    `to_dict()` is flat: the run's fields, then the job's own (lists); `from_dict` reads them
    back (lists as tuples).
    """

    kind: ClassVar[str] = "memory"
    runner: ClassVar[str] = "lmperf.questions.memory.job:run_job"

    analysis: str = ""
    contexts: tuple[int, ...] = ()
    modes: tuple[str, ...] = ("forward", "train-step")
    groups: tuple[str | int, ...] = ()
    top: int = 10

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("contexts", "modes"):  # read back from JSON as lists
            object.__setattr__(self, name, tuple(getattr(self, name)))
        choice("analysis", self.analysis, ANALYSES)
        if not self.contexts:
            raise SpecError("a memory job needs at least one context length")
        for t in self.contexts:
            positive_int("context", t)
        for m in self.modes:
            choice("mode", m, MODES)
        positive_int("top", self.top)
        object.__setattr__(self, "groups", tuple(checkpoint_policy(g) for g in self.groups))

    @classmethod
    def from_run(cls, run: RunSpec, **own: object) -> "MemorySpec":
        """A MemorySpec with the fields of `run` and the job's `own` fields."""
        return cls(**{f.name: getattr(run, f.name) for f in fields(RunSpec)}, **own)

    @property
    def run(self) -> RunSpec:
        """The RunSpec being measured."""
        return RunSpec(**{f.name: getattr(self, f.name) for f in fields(RunSpec)})

    def to_dict(self) -> dict:
        """A flat JSON-ready dict: the run's fields, then the job's own."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in super().to_dict().items()}

    def label(self) -> str:
        """Short name for progress lines, e.g. 'phases tiny fp32 ctx 128,256'."""
        name = f"{self.model} ({self.shape()})" if self.model else self.size
        what = f" groups {','.join(map(str, self.groups))}" if self.analysis == "checkpoint" else ""
        return (f"{self.analysis} {name} {self.precision} b={self.batch} "
                f"ctx {','.join(map(str, self.contexts))}{what}")
