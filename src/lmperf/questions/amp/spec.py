"""AmpSpec: one precision experiment as a job (run by the sweep like every other job: its own
process, timeout, memory cap, resume, failures as rows)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from lmperf.validate import choice


def _frozen(value: object) -> object:
    """Lists (from JSON or the CLI) as tuples, so that the spec stays hashable."""
    return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


@dataclass(frozen=True)
class AmpSpec:
    """One run of one experiment of the precision lab.

    Attributes:
        experiment: a name from `lmperf.questions.amp.EXPERIMENT_NAMES`.
        device: 'cpu' or 'cuda' (resolved).
        options: the experiment's own options that were given, as sorted (name, value) pairs
            (the others take its run()'s defaults).
        plot: where to write its PNG, or None.
        threads: torch's intra-op CPU threads (0: torch's default).
    """

    kind: ClassVar[str] = "amp"
    runner: ClassVar[str] = "lmperf.questions.amp.job:run_job"

    experiment: str
    device: str = "cpu"
    options: tuple[tuple[str, object], ...] = ()
    plot: str | None = None
    threads: int = 0

    def __post_init__(self) -> None:
        from lmperf.questions.amp import EXPERIMENT_NAMES

        choice("experiment", self.experiment, EXPERIMENT_NAMES)
        object.__setattr__(self, "options",
                           tuple(sorted((k, _frozen(v)) for k, v in dict(self.options).items())))

    def kwargs(self) -> dict:
        """The options as keyword arguments of the experiment's run()."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.options}

    def to_dict(self) -> dict:
        """JSON-ready dict (the job's identity; the record's spec is the experiment's params)."""
        return {"experiment": self.experiment, "device": self.device, "options": self.kwargs(),
                "plot": self.plot, "threads": self.threads}

    @classmethod
    def from_dict(cls, data: dict) -> "AmpSpec":
        """Inverse of `to_dict`."""
        return cls(experiment=data["experiment"], device=data.get("device", "cpu"),
                   options=tuple((data.get("options") or {}).items()), plot=data.get("plot"),
                   threads=data.get("threads", 0))

    def label(self) -> str:
        """Short name for progress lines."""
        return f"amp {self.experiment}"
