"""The doctor's machinery inside one job: what a check is, what it answers, how it is run.

A check is a small function that exercises one path lmperf relies on, for real, on one device
scope ('any', 'cpu' or 'cuda'), and answers ok / fail / skip with a one-line result (what it
measured) and why. A check that raises is a 'fail' whose result is the exception, so one broken
path never hides the others. Each check runs as a job of its own (`doctor.job`); checks that
judge the same launched process (`Context.result_of`) share one job, so it is launched once.
"""

from __future__ import annotations

import traceback
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from lmperf.core.outcome import first_line

STATUSES: tuple[str, ...] = ("ok", "fail", "skip")
SCOPES: tuple[str, ...] = ("any", "cpu", "cuda")


@dataclass
class Outcome:
    """What a check answered.

    status: 'ok', 'fail' or 'skip'; result: what was measured, one line; why: the criterion, or
    the reason for a failure or a skip; values: the measured numbers (for the record).
    """

    status: str
    result: str = ""
    why: str = ""
    values: dict[str, Any] = field(default_factory=dict)
    traceback: str | None = None

    def row(self, check: str, scope: str, seconds: float) -> dict[str, Any]:
        """The check's row as a record stores it (`seconds`: how long the check took)."""
        row = {"check": check, "device": scope, "status": self.status, "result": self.result,
               "why": self.why, "seconds": round(seconds, 3), "values": self.values}
        if self.traceback:
            row["traceback"] = self.traceback
        return row


def ok(result: str, why: str = "", **values: Any) -> Outcome:
    """A passed check: `result` says what was measured, `why` what it had to satisfy."""
    return Outcome("ok", result, why, values)


def fail(result: str, why: str, **values: Any) -> Outcome:
    """A failed check: `why` says what was expected and not seen."""
    return Outcome("fail", result, why, values)


def skip(why: str, result: str = "-", **values: Any) -> Outcome:
    """A check that could not run here, and why."""
    return Outcome("skip", result, why, values)


def passed(condition: bool, result: str, why: str, **values: Any) -> Outcome:
    """ok or fail by `condition`, with the same result and criterion either way."""
    return (ok if condition else fail)(result, why, **values)


Launch = Callable[["Context"], Callable[[], Any]]
"""ctx -> a function that runs a process (a capped child, torchrun's ranks) for its answer."""


@dataclass
class Context:
    """What a check may use: its device, a scratch folder, and the answers of the processes
    launched so far in this job (by launch function)."""

    device: torch.device
    workdir: Path
    launched: dict[Launch, Future] = field(default_factory=dict)

    def result_of(self, launch: Launch) -> Any:
        """The answer of `launch`'s process, run once per job (the checks that judge it share
        it); an exception it raised is raised again to every check that asks."""
        if launch not in self.launched:
            answer: Future = Future()
            try:
                answer.set_result(launch(self)())
            except Exception as exc:  # noqa: BLE001 - the checks that read it report it
                answer.set_exception(exc)
            self.launched[launch] = answer
        return self.launched[launch].result()


@dataclass(frozen=True)
class Check:
    """One check.

    name: its row in the table; scope: the device it checks ('any': the doctor's device);
    run: ctx -> Outcome; launches: what it launches ('' for nothing: it runs in its job's
    process); checks of one scope that launch the same thing judge one launch, in one job.
    """

    name: str
    scope: str
    run: Callable[[Context], Outcome]
    launches: str = ""


def run_one(check: Check, ctx: Context) -> Outcome:
    """Run a check; an exception is a 'fail' carrying its traceback."""
    try:
        outcome = check.run(ctx)
    except Exception as exc:  # noqa: BLE001 - a broken path is a row, not a crash
        said = first_line(exc) if str(exc).strip() else ""  # 'TypeName: first line', cut
        outcome = Outcome("fail", f"{type(exc).__name__}: {said}"[:160],
                          "raised an exception (see the record)",
                          traceback=traceback.format_exc(limit=6))
    if outcome.status not in STATUSES:
        raise ValueError(f"check {check.name!r} answered {outcome.status!r}")
    return outcome
