"""The doctor's checks as jobs: `CheckJob` names one check (or the few that judge one launched
process) and is run by the sweep like every other job: its own process, a timeout, `--resume`,
and a crash or a hang as a row. Each check writes one `kind: "doctor"` record.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from lmperf.errors import SpecError
# The check table (every check's module) at import: the warm server imports a job's runner
# module once before forking, so each check's child does not import them again (0.6 s a job).
from lmperf.questions.doctor import registry
from lmperf.questions.doctor.checks import Context, Row, run_one
from lmperf.questions.doctor.records import KIND, check_record
from lmperf.runtime import device as dev
from lmperf.runtime import env as envmod


@dataclass(frozen=True)
class CheckJob:
    """One job of the doctor.

    Attributes:
        checks: row names of the registry, all of one scope, in table order (several only
            when they share a launch: `Check.job`); each is an item with a record of its own.
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

    def to_dict(self) -> dict:
        """JSON-ready dict (the job's identity)."""
        return {"checks": list(self.checks), "scope": self.scope, "device": self.device,
                "threads": self.threads}

    @classmethod
    def from_dict(cls, data: dict) -> "CheckJob":
        """Inverse of `to_dict`."""
        return cls(**data)

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


def run_job(job: CheckJob) -> list[dict]:
    """Run the job's checks in order on its device, in a scratch folder; one record per check
    (ok / error for a failed check / unsupported for a skipped one; see
    `records.check_record`). The checks seed torch; the caller's random streams are restored
    (an inline run)."""
    by_name = {c.name: c for c in registry.CHECKS}
    device = torch.device(job.device)
    environment = envmod.capture(device)
    rng_devices = [dev.cuda_index(device)] if device.type == "cuda" else []
    records = []
    with tempfile.TemporaryDirectory(prefix="lmperf-doctor-") as tmp, \
            torch.random.fork_rng(devices=rng_devices):
        ctx = Context(device, Path(tmp))
        for name in job.checks:
            begin = time.perf_counter()
            outcome = run_one(by_name[name], ctx)
            row = Row(name, job.scope, outcome, time.perf_counter() - begin)
            records.append(check_record(row.as_dict(), job.item_spec(name), environment))
    return records
