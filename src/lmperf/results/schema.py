"""The record: one JSON object per run, self-contained (spec, environment, raw samples, status)."""

from __future__ import annotations

import math

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


def is_record(obj: object) -> bool:
    """Whether `obj` has the fields every record carries."""
    return (isinstance(obj, dict) and isinstance(obj.get("spec"), dict)
            and obj.get("status") in STATUSES and "kind" in obj and "schema" in obj)


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
