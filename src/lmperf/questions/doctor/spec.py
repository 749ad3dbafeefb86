"""`CheckJob`: one job of the doctor, one check (or the few that judge one launched process),
run by the sweep like every other job (its own process, a timeout, `--resume`, a crash or a
hang as a row). No torch: the parent plans jobs before any check imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from lmperf.errors import SpecError
from lmperf.questions.doctor.records import KIND
from lmperf.results.schema import SpecDict

CPU_WORKERS = 3
"""Jobs in flight at once when no CUDA check runs: the torchrun launch, a second launching job
and the in-process checks (2 workers were slower on the 2-core VM: docs/runs/2026-11-25.md)."""


@dataclass(frozen=True)
class CheckJob(SpecDict):
    """One job of the doctor.

    Attributes:
        checks: row names of the registry, all of one scope, in table order (several only
            when they share a launch: `Check.launches`); each is an item with a record of its own.
        scope: 'any', 'cpu' or 'cuda' (the rows' `device` column).
        device: what the checks run on: 'cpu' or 'cuda' (resolved).
        threads: torch's intra-op CPU threads (1: the configuration every command runs in).
    """

    kind: ClassVar[str] = KIND
    runner: ClassVar[str] = "lmperf.questions.doctor.job:run_job"

    checks: tuple[str, ...]
    scope: str
    device: str = "cpu"
    threads: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "checks", tuple(self.checks))  # a list from JSON
        if not self.checks:
            raise SpecError("a doctor job needs at least one check")

    def items(self) -> list[str]:
        """The checks, in order (`--resume` keeps those without an ok record)."""
        return list(self.checks)

    def item_spec(self, item: str) -> dict:
        """The spec of one check's record."""
        return {"check": item, "scope": self.scope, "device": self.device,
                "threads": self.threads}

    def with_items(self, items: list[str]) -> "CheckJob":
        """The same job with only `items`."""
        return CheckJob(tuple(items), self.scope, self.device, self.threads)

    def label(self) -> str:
        """Short name for progress lines (each record's line names its check)."""
        return f"doctor ({self.scope})"
