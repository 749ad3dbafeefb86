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
_OWN = ("analysis", "contexts", "modes", "groups", "top")


@dataclass(frozen=True)
class MemorySpec:
    """What one memory job measures.

    Attributes:
        run: the model, batch, precision, attention, optimizer, seed, device, threads, warm-up
            and timed steps; its context length is the longest of `contexts` (the model is
            built for it and shorter contexts cut the batch).
        analysis: 'phases', 'saved' or 'checkpoint'.
        contexts: the context lengths measured, ascending.
        modes: the steps of the phases analysis ('forward', 'train-step', ...).
        groups: checkpointing policies, canonical (lmperf.validate.checkpoint_policy; 'none'
            is always measured first).
        top: rows of the largest saved activations kept in a 'saved' record.
    """

    kind: ClassVar[str] = "memory"
    runner: ClassVar[str] = "lmperf.questions.memory.job:run_job"

    run: RunSpec
    analysis: str
    contexts: tuple[int, ...]
    modes: tuple[str, ...] = ("forward", "train-step")
    groups: tuple[str | int, ...] = ()
    top: int = 10

    def __post_init__(self) -> None:
        choice("analysis", self.analysis, ANALYSES)
        if not self.contexts:
            raise SpecError("a memory job needs at least one context length")
        for t in self.contexts:
            positive_int("context", t)
        for m in self.modes:
            choice("mode", m, MODES)
        positive_int("top", self.top)
        object.__setattr__(self, "groups", tuple(checkpoint_policy(g) for g in self.groups))

    @property
    def device(self) -> str:
        """'cpu' or 'cuda' (the run's)."""
        return self.run.device

    @property
    def threads(self) -> int:
        """torch's intra-op CPU threads (0: torch's default)."""
        return self.run.threads

    def to_dict(self) -> dict:
        """A flat JSON-ready dict: the run's fields, then the job's own."""
        return {**self.run.to_dict(), "analysis": self.analysis, "contexts": list(self.contexts),
                "modes": list(self.modes), "groups": list(self.groups), "top": self.top}

    @classmethod
    def from_dict(cls, data: dict) -> "MemorySpec":
        """Inverse of `to_dict` (missing fields take their defaults); SpecError otherwise."""
        run_fields = {f.name for f in fields(RunSpec)}
        unknown = set(data) - run_fields - set(_OWN)
        if unknown:
            raise SpecError(f"unknown MemorySpec field(s): {', '.join(sorted(unknown))}")
        if "analysis" not in data or "contexts" not in data:
            raise SpecError("a MemorySpec needs 'analysis' and 'contexts'")
        own = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in _OWN}
        run = RunSpec.from_dict({k: v for k, v in data.items() if k in run_fields})
        return cls(run=run, **own)

    def label(self) -> str:
        """Short name for progress lines, e.g. 'phases tiny fp32 ctx 128,256'."""
        name = f"{self.run.model} ({self.run.shape()})" if self.run.model else self.run.size
        what = f" groups {','.join(map(str, self.groups))}" if self.analysis == "checkpoint" else ""
        return (f"{self.analysis} {name} {self.run.precision} b={self.run.batch} "
                f"ctx {','.join(map(str, self.contexts))}{what}")
