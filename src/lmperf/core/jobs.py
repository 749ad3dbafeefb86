"""What a job is: a frozen spec that names its record kind and the function that measures it.

The launcher, the sweep and the child process only see this protocol. The measuring function is
named by a "package.module:function" string and imported where the job runs (in this process or
in a child), so the core never imports a question's package.
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar, Protocol

from lmperf.results.record import spec_id


class JobSpec(Protocol):
    """A frozen, JSON-serialisable description of one job (the identity of its result): the
    record `kind` it produces, its `runner` ("package.module:function" taking the spec and
    returning a record or a list of them, never raising for a failure of the run itself), its
    resolved `device` and (optionally) torch's CPU `threads` (0: torch's default)."""

    kind: ClassVar[str]
    runner: ClassVar[str]
    device: str

    def to_dict(self) -> dict: ...

    def label(self) -> str: ...


def resolve(target: str) -> Any:
    """Import "package.module:attribute" and return the attribute."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def class_path(spec: object) -> str:
    """"package.module:Class" of a spec, so that a child process can rebuild it."""
    cls = type(spec)
    return f"{cls.__module__}:{cls.__qualname__}"


def job_id(spec: JobSpec) -> str:
    """A short stable hash of a job's kind and spec; every record a job writes carries it, so
    that `--resume` can recognise the job even when its records have specs of their own."""
    return spec_id(spec.kind, spec.to_dict())


def threads_of(spec: object) -> int:
    """The spec's CPU thread count (0 when it has none: torch's default stays)."""
    n = getattr(spec, "threads", 0)
    return n if isinstance(n, int) and n > 0 else 0
