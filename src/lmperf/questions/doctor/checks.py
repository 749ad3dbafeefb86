"""The doctor's machinery: what a check is, what it answers, and how the list is run.

A check is a small function that exercises one path lmperf relies on, for real, on one device
scope ('any', 'cpu' or 'cuda'), and answers ok / fail / skip with a one-line result (what it
measured) and why. A check that raises is a 'fail' whose result is the exception, so one broken
path never hides the others. Checks that run a child process start it in the background when
the doctor begins (`Check.start`), so their wait overlaps the in-process checks.
"""

from __future__ import annotations

import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

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


@dataclass
class Context:
    """What a check may use: its device, a scratch folder, and the background jobs started."""

    device: torch.device
    workdir: Path
    background: dict[str, Future] = field(default_factory=dict)


@dataclass(frozen=True)
class Check:
    """One check.

    name: its row in the table; scope: the device it checks ('any': the doctor's device);
    run: ctx -> Outcome; start: optional ctx -> a callable run in a background thread as soon
    as the doctor begins (its Future is `ctx.background[name]`).
    """

    name: str
    scope: str
    run: Callable[[Context], Outcome]
    start: Callable[[Context], Callable[[], Any]] | None = None


@dataclass
class Row:
    """A check's row: the check, its scope, its outcome and how long it took (seconds)."""

    check: str
    scope: str
    outcome: Outcome
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        """The row as a record stores it."""
        row = {"check": self.check, "device": self.scope, "status": self.outcome.status,
               "result": self.outcome.result, "why": self.outcome.why,
               "seconds": round(self.seconds, 3), "values": self.outcome.values}
        if self.outcome.traceback:
            row["traceback"] = self.outcome.traceback
        return row


def first_line(exc: BaseException) -> str:
    """'TypeName: first line of the message' (cut to 160 characters)."""
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}"[:160]


def run_one(check: Check, ctx: Context) -> Outcome:
    """Run a check; an exception is a 'fail' carrying its traceback."""
    try:
        outcome = check.run(ctx)
    except Exception as exc:  # noqa: BLE001 - a broken path is a row, not a crash
        outcome = Outcome("fail", first_line(exc), "raised an exception (see the record)",
                          traceback=traceback.format_exc(limit=6))
    if outcome.status not in STATUSES:
        raise ValueError(f"check {check.name!r} answered {outcome.status!r}")
    return outcome


def run_checks(checks: Sequence[Check], contexts: dict[str, Context | str],
               report: Callable[[Row], None] | None = None) -> list[Row]:
    """Run `checks` in order. `contexts` maps a scope to its Context, or to the reason its
    checks are skipped (e.g. 'no CUDA device'). Background starters run first, in threads;
    `report` is called with each row as it is made (progress)."""
    runnable = [c for c in checks if isinstance(contexts.get(c.scope), Context)]
    rows: list[Row] = []
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="lmperf-doctor") as pool:
        for check in runnable:
            if check.start is not None:
                ctx = contexts[check.scope]
                assert isinstance(ctx, Context)
                try:
                    ctx.background[check.name] = pool.submit(check.start(ctx))
                except Exception as exc:  # noqa: BLE001 - the check will report it
                    failed: Future = Future()
                    failed.set_exception(exc)
                    ctx.background[check.name] = failed
        for check in checks:
            ctx = contexts.get(check.scope)
            begin = time.perf_counter()
            outcome = run_one(check, ctx) if isinstance(ctx, Context) else skip(str(ctx))
            rows.append(Row(check.name, check.scope, outcome, time.perf_counter() - begin))
            if report is not None:
                report(rows[-1])
    return rows
