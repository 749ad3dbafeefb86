"""Turning an exception into a record's status: the one place that decides ok / oom / error
(`core.envelope` wraps every in-process measurement in it; the torchrun ranks call it too)."""

from __future__ import annotations

import traceback
from dataclasses import dataclass

from lmperf.errors import LmperfError


@dataclass
class Stage:
    """What a run is doing now, for the message of a failure ("out of memory while ...")."""

    now: str = "starting"


PREFLIGHT = "checking that one step fits (simulated, pre-flight)"
"""The stage of `estimate.preflight.check_fits`: a predicted oom row says it, not "building"."""


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message, or its type name."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def failure(exc: BaseException, stage: Stage | str) -> dict:
    """Fields of a failed run's record: status 'oom' or 'error', the message, and for an
    unexpected exception (not an LmperfError) a short traceback."""
    from lmperf.runtime.device import is_oom  # the device layer decides what is out of memory

    where = stage.now if isinstance(stage, Stage) else stage
    if is_oom(exc):
        return {"status": "oom", "message": f"out of memory while {where}: {first_line(exc)}"}
    fields: dict = {"status": "error", "message": f"{type(exc).__name__} while {where}: {exc}"}
    if not isinstance(exc, LmperfError):
        fields["traceback"] = traceback.format_exc(limit=8)
    return fields
