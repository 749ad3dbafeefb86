"""The record: one JSON object per run, self-contained (spec, environment, raw samples, status)."""

from __future__ import annotations

import math
from dataclasses import asdict, fields
from typing import ClassVar, TypeVar

from lmperf.errors import SpecError

# 2: issue 27; 3: issue 40, a plan's candidate names its whole layout (older records are
# migrated on read: results/record.py)
SCHEMA_VERSION = 3
STATUSES: tuple[str, ...] = ("ok", "oom", "error", "unsupported")


def make_record(kind: str, spec: dict, status: str, env: dict, *, message: str = "",
                params: int | None = None, metrics: dict | None = None,
                warnings: list[str] | None = None, **extra: object) -> dict:
    """A record dict in the schema's field order: its kind, `spec` (the run's identity), a
    status of STATUSES, `env` (the environment capture), `message` (why it is not ok),
    `metrics` (None unless ok), `warnings` for the reader, and `extra` top-level fields (e.g.
    'log_tail' of a crashed child)."""
    if status not in STATUSES:
        raise ValueError(f"unknown status {status!r}; accepted: {', '.join(STATUSES)}")
    return {
        "schema": SCHEMA_VERSION,
        "kind": kind,
        "status": status,
        "message": message,
        "spec": spec,
        "params": params,
        "env": env,
        "metrics": metrics,
        "warnings": list(warnings or []),
        **extra,
    }


_S = TypeVar("_S", bound="SpecDict")


class SpecDict:
    """The dict round trip of a frozen dataclass spec, mixed in. `to_dict` is the record's
    `spec` and the input of its job id (the `not_identity` fields, launch options, left out);
    `to_full_dict` keeps everything; `from_dict` is the inverse of either (JSON lists back to
    tuples): a field an older record lacks takes `old_defaults`' value, else its default, and
    a field this version does not know is refused (dropped where `drop_unknown`)."""

    not_identity: ClassVar[tuple[str, ...]] = ()
    old_defaults: ClassVar[dict] = {}
    drop_unknown: ClassVar[bool] = False

    def to_dict(self) -> dict:
        """The spec's identity as a JSON-ready dict."""
        return {k: v for k, v in self.to_full_dict().items() if k not in self.not_identity}

    def to_full_dict(self) -> dict:
        """Every field (what a child or a rank rebuilds the spec from)."""
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[_S], data: dict) -> _S:
        """Inverse of `to_dict` / `to_full_dict`."""
        known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        unknown = set(data) - known
        if unknown and not cls.drop_unknown:
            raise SpecError(f"unknown {cls.__name__} field(s): {', '.join(sorted(unknown))}")
        given = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in known}
        return cls(**{**cls.old_defaults, **given})


def to_jsonable(obj: object) -> object:
    """Plain JSON types: numpy scalars unwrapped, non-finite floats as strings, dtypes as names."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        try:
            obj = obj.item()  # numpy / torch scalars
        except (ValueError, TypeError, RuntimeError):
            return str(obj)
    if isinstance(obj, float):
        if math.isnan(obj):
            return "nan"
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
        return obj
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    return str(obj)  # torch.dtype, torch.device, ...
