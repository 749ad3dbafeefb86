"""Reading a record back: the envelope every kind shares, checked on read, and older records
migrated to today's layout (so a file written by an earlier lmperf still loads, and a file that
is not lmperf's is refused in one line naming the line).

The envelope (see `schema.make_record`): schema (int), kind (a question's record kind), status
(ok / oom / error / unsupported), message (str), spec (dict: the run's identity), env (dict),
metrics (dict for an 'ok' record: its measurements), warnings (list of str). Kinds add their own
top-level fields (params, job_id, round, log_tail, ...), which are kept as they are.
This module imports nothing that runs a model (no torch).
"""

from __future__ import annotations

import math

from lmperf.catalog import BY_KIND
from lmperf.results.schema import SCHEMA_VERSION, STATUSES

# Non-finite floats are written as strings by `schema.to_jsonable` (JSON has no NaN/inf).
NON_FINITE: dict[str, float] = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def from_jsonable(value: object) -> object:
    """The inverse of `schema.to_jsonable` for numbers: 'nan', 'inf', '-inf' back to floats
    (recursively through lists and dicts); every other value unchanged."""
    if isinstance(value, str):
        return NON_FINITE.get(value, value)
    if isinstance(value, list):
        return [from_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: from_jsonable(v) for k, v in value.items()}
    return value


def as_number(value: object) -> float:
    """A record's number as a float: None -> NaN, 'inf' / '-inf' / 'nan' -> the float; raises
    ValueError for anything else that is not a number."""
    if value is None:
        return math.nan
    if isinstance(value, bool):
        raise ValueError(f"not a number: {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value in NON_FINITE:
        return NON_FINITE[value]
    raise ValueError(f"not a number: {value!r}")


def problem(obj: object) -> str | None:
    """What makes `obj` not a readable lmperf record (one phrase), or None when it is one."""
    if not isinstance(obj, dict):
        return f"not an lmperf record (a JSON {type(obj).__name__}, not an object)"
    missing = [k for k in ("schema", "kind", "status", "spec") if k not in obj]
    if missing:
        return f"not an lmperf record (no {', '.join(missing)})"
    schema, kind, status = obj["schema"], obj["kind"], obj["status"]
    if not isinstance(schema, int) or isinstance(schema, bool) or not 1 <= schema <= SCHEMA_VERSION:
        return (f"a record of schema {schema!r}; this lmperf reads schemas 1 to {SCHEMA_VERSION}"
                " (a newer lmperf wrote it?)")
    if kind not in BY_KIND:
        return (f"a record of unknown kind {kind!r}; lmperf writes "
                f"{', '.join(sorted(BY_KIND))}" + (" (lmperf compare's rows are not records)"
                                                   if kind == "compare" else ""))
    if status not in STATUSES:
        return f"a {kind} record with unknown status {status!r} (accepted: {', '.join(STATUSES)})"
    if not isinstance(obj["spec"], dict):
        return f"a {kind} record whose spec is not an object"
    if status == "ok" and not isinstance(obj.get("metrics"), dict):
        return f"an ok {kind} record without metrics"
    for key, typ in (("env", dict), ("warnings", list), ("message", str)):
        if obj.get(key) is not None and not isinstance(obj[key], typ):
            return f"a {kind} record whose {key} is not a{'n' if typ is dict else ''} {typ.__name__}"
    return None


# Renamed spec fields, per kind: (old name, new name). A record written before a rename is read
# with the new name, so tables, `compare` and `--resume` see one vocabulary. Issue 17 gave every
# spec the shared vocabulary's names (--context, --batch, --attention, --steps).
_RUN_RENAMES = (("context_length", "context"), ("model_context_length", "model_context"),
                ("batch_size", "batch"))
SPEC_RENAMES: dict[str, tuple[tuple[str, str], ...]] = {
    **{kind: _RUN_RENAMES for kind in ("bench", "profile", "memory", "dist", "prediction")},
    "attention": (("impl", "attention"), ("seq", "context"), ("repeats", "steps")),
}


def spec_before_renames(kind: str, spec: dict) -> dict | None:
    """`spec` (today's names) with each renamed field under the name it had before, or None when
    none of its fields was renamed: the identity a job had when records were written before a
    rename, so that `--resume` still recognises their job ids."""
    renames = [(old, new) for old, new in SPEC_RENAMES.get(kind, ()) if new in spec]
    if not renames:
        return None
    back = dict(spec)
    for old, new in renames:
        back[old] = back.pop(new)
    return back


def migrate(record: dict) -> dict:
    """`record` in today's layout: fields every record now carries get their defaults (an
    older record lacks `message`, `env`, `warnings`, `params`), and renamed spec fields take
    their new names. The input is not modified."""
    out = {"message": "", "params": None, "env": {}, "metrics": None, "warnings": [], **record}
    renames = SPEC_RENAMES.get(out["kind"], ())
    if renames and any(old in out["spec"] for old, _ in renames):
        spec = dict(out["spec"])
        for old, new in renames:
            if old in spec and new not in spec:
                spec[new] = spec.pop(old)
        out["spec"] = spec
    return out
