"""Reading a record back: the envelope every kind shares, checked on read, and records of an
older schema migrated to today's layout, here and nowhere else (so a file written by an earlier
lmperf still loads, and a file that is not lmperf's is refused in one line naming the line).
A change of the layout bumps `schema.SCHEMA_VERSION` and adds its step to `migrate`. The
envelope is `schema.make_record`'s; the top-level fields kinds add (job_id, round, log_tail,
...) are kept as they are. This module imports nothing that runs a model (no torch).
"""

from __future__ import annotations

import hashlib
import json
import math
import re

from typing import TYPE_CHECKING

from lmperf.catalog import BY_KIND
from lmperf.results.schema import SCHEMA_VERSION, STATUSES

# Non-finite floats are written as strings by `schema.to_jsonable` (JSON has no NaN/inf).
NON_FINITE: dict[str, float] = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}

if TYPE_CHECKING:
    import pandas as pd


def stored_table(title: str, rows: list[dict]) -> "pd.DataFrame":
    """A table as a record stores it, back as a DataFrame with its numbers as numbers: a column
    of numbers with 'nan'/'inf' strings in it gets them as floats; text columns stay text.
    `title` is the table's (kept for callers)."""
    import pandas as pd  # here: reading a record needs no pandas

    df = pd.DataFrame(rows)
    for col in df.columns:
        values = [v for v in df[col] if v is not None]
        if any(isinstance(v, str) and v in NON_FINITE for v in values) and all(
                isinstance(v, (int, float)) or v in NON_FINITE for v in values):
            df[col] = [math.nan if v is None else NON_FINITE.get(v, v) for v in df[col]]
            df[col] = df[col].astype(float)
    return df


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


def spec_key(kind: str, spec: dict) -> str:
    """The identity of a run: its kind and spec as canonical JSON."""
    return json.dumps({"kind": kind, "spec": spec}, sort_keys=True, separators=(",", ":"))


def spec_id(kind: str, spec: dict) -> str:
    """A short stable hash of `spec_key` (a job's id: `core.jobs.job_id`)."""
    return hashlib.sha1(spec_key(kind, spec).encode()).hexdigest()[:16]


def migrate(records: list[dict]) -> list[dict]:
    """`records` (each accepted by `problem`) in today's layout, schema `SCHEMA_VERSION`. The
    one place an older layout is read: the readers (tables, reports, compare, `--resume`) see
    only today's. Fields every record now carries get their defaults (`message`, `params`,
    `env`, `metrics`, `warnings`). The inputs are not modified."""
    out = []
    for record in records:
        record = {"message": "", "params": None, "env": {}, "metrics": None, "warnings": [],
                  **record}
        if record["kind"] == "plan" and "search" not in record["spec"]:
            record = _plan_search(record)
        older = _from_schema_1(record) if record.get("schema") == 1 else [record]
        out += [_from_schema_2(r) if r.get("schema") == 2 else r for r in older]
    return out


def _from_schema_2(record: dict) -> dict:
    """A schema-2 record in schema 3's layout: activation checkpointing named (issue 41:
    `_checkpoint_names`, every kind); a plan candidate's (or --confirm cell's) spec
    names its whole layout (issue 40): FSDP x TP ('fsdp+tp') is fsdp with its tp, TP over every
    device ('tp') is one replica; the data-parallel replicate and shard degrees (DDP
    replicates, the others shard), no pipeline and no context parallelism; no compile, no
    float8 (issue 41)."""
    record = _checkpoint_names(record)
    spec = record["spec"]
    if record["kind"] != "plan" or "strategy" not in spec or "pp" in spec:
        return {**record, "schema": 3}
    spec = {"compile": False, "float8": "none", **spec}
    name = {"fsdp+tp": "fsdp", "tp": "single"}.get(spec["strategy"], spec["strategy"])
    d = spec["gpus"] // spec.get("tp", 1)
    return {**record, "schema": 3, "spec": {
        **spec, "strategy": name, "dp_replicate": d if name == "ddp" else 1,
        "dp_shard": 1 if name in ("ddp", "single") else d, "pp": 1, "cp": 1,
        "pp_schedule": None, "pp_virtual": 1, "async_tp": False}}


# Spec fields that held a checkpointing policy as a block-group size before issue 41: every
# RunSpec-based kind's and dist train's `checkpoint`, memory's `checkpoint_group`, a plan
# request's `checkpoints`.
_CHECKPOINT_FIELDS = ("checkpoint", "checkpoint_group", "checkpoints")


def _checkpoint_name(value: object) -> object:
    """A group size as issue 41 names it: 0 'none', 1 'full', G >= 2 kept; else unchanged."""
    if isinstance(value, list):
        return [_checkpoint_name(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool):
        return {0: "none", 1: "full"}.get(value, value)
    return value


def _checkpoint_names(record: dict) -> dict:
    """`record` with its checkpointing fields named (`_checkpoint_name`) and, where its spec was
    its job's (its job id is the old spec's), the job id of the named spec, so that `--resume`
    recognises the job (a job of several records, memory's, keeps its id: its records' specs
    are not the job's, and it runs again)."""
    spec = record["spec"]
    named = {k: _checkpoint_name(v) for k, v in spec.items() if k in _CHECKPOINT_FIELDS}
    if all(named[k] == spec[k] and type(named[k]) is type(spec[k]) for k in named):
        return record
    new = {**spec, **named}
    out = {**record, "spec": new}
    job, _, round_ = str(record.get("job_id", "")).partition("-r")
    if job and job == spec_id(record["kind"], spec):
        out["job_id"] = spec_id(record["kind"], new) + (f"-r{round_}" if round_ else "")
    return out


def _plan_search(record: dict) -> dict:
    """A plan record from before searches had ids (issue 35) gets one from its request and the
    time its search took (the same for all its records; its --confirm cells, without it, are
    a search of their own)."""
    request = {k: v for k, v in record["spec"].items() if k in _PLAN_REQUEST}
    took = (record.get("metrics") or {}).get("search_s")
    return {**record, "spec": {**record["spec"], "search": spec_id("plan", {**request, "t": took})}}


_PLAN_REQUEST = ("size", "context", "global_batch", "gpus", "course", "model", "gpu", "device",
                 "gpus_per_node", "gib", "precisions", "checkpoints", "attention", "host_us")


# Spec fields renamed before schema 2, per kind: (old name, new name). Issue 17 gave every spec
# the shared vocabulary's names (--context, --batch, --attention, --steps); issue 10 named
# train's regime its precision.
_RUN_RENAMES = (("context_length", "context"), ("model_context_length", "model_context"),
                ("batch_size", "batch"))
_RENAMES_1: dict[str, tuple[tuple[str, str], ...]] = {
    **{kind: _RUN_RENAMES for kind in ("bench", "profile", "memory", "dist", "prediction")},
    "attention": (("impl", "attention"), ("seq", "context"), ("repeats", "steps"),
                  ("precision", "dtype")),
    "train": (("regime", "precision"), ("warmup_steps", "lr_warmup")),
}
_CHECK_STATUS = {"ok": "ok", "fail": "error", "skip": "unsupported"}  # doctor.records'
_MEAN_STD = re.compile(r"^\s*(-?[\d.]+(?:e[-+]?\d+)?)\s*±\s*(-?[\d.]+(?:e[-+]?\d+)?)\s*$")
_PAIR = re.compile(r"^\('(.+)', '(.+)'\)$")


def _from_schema_1(record: dict) -> list[dict]:
    """A schema-1 record in schema 2's layout (one or, for the doctor's whole-run record,
    several records): renamed spec fields, with the job id of the renamed spec where the spec
    was its job's (so that `--resume` recognises the job); train's corpus facts out of its
    spec; a RunSpec without an edition is the 2025 course's; profile's tables as numbers."""
    kind, spec, metrics = record["kind"], dict(record["spec"]), record["metrics"]
    renames = [(old, new) for old, new in _RENAMES_1.get(kind, ())
               if old in spec and new not in spec]
    out = {**record, "schema": 2, "spec": spec}
    if renames:
        old_id = spec_id(kind, spec)
        for old, new in renames:
            spec[new] = spec.pop(old)
        job, _, round_ = str(record.get("job_id", "")).partition("-r")
        if job == old_id:  # the spec is its job's; a job of several records keeps its old id
            out["job_id"] = spec_id(kind, spec) + (f"-r{round_}" if round_ else "")
    if kind == "train" and isinstance(spec.get("data"), dict):
        out["corpus"], spec["data"] = spec["data"], None
    if "d_model" in spec and "course" not in spec:
        spec["course"] = "2025"
    if kind == "prediction" and isinstance(metrics, dict):  # host and device apart since 26
        out["metrics"] = {phase: {"device_s": None, "host_s": None, **m} if isinstance(m, dict)
                          else m for phase, m in metrics.items()}
    if kind == "profile":  # one profiler since issue 27: the spec's backend ('torch') went
        spec.pop("backend", None)
    if kind == "profile" and isinstance(metrics, dict) and metrics.get("tables"):
        out["metrics"] = {**metrics, "tables": {t: _numeric_table(rows)
                                                for t, rows in metrics["tables"].items()}}
    if kind == "doctor" and isinstance(metrics, dict) and "checks" in metrics:
        return [{**out, "status": _CHECK_STATUS[row["status"]], "metrics": row,
                 "spec": {**spec, "check": row["check"], "scope": row["device"]}}
                for row in metrics["checks"]]
    return [out]


def _numeric_table(rows: list[dict]) -> list[dict]:
    """A profile table as schema 2 writes it: numbers (`_numeric_row`), and a side-by-side
    table (its columns were "('forward', 'name')") ranked."""
    out = [_numeric_row(r) for r in rows]
    if rows and any(_PAIR.match(c) for c in rows[0]):
        out = [{"rank": i, **r} for i, r in enumerate(out, start=1)]
    return out


def _numeric_row(row: dict) -> dict:
    """A profile table's row as schema 2 writes it: "12.34 ± 0.56" as `<col>_mean` and
    `<col>_std`, an "+x%" overhead as `overhead_pct`, "('forward', 'name')" as "forward name"."""
    out: dict = {}
    for col, v in row.items():
        pair = _MEAN_STD.match(v) if isinstance(v, str) else None
        if col == "overhead" and isinstance(v, str):
            out["overhead_pct"] = _float(v.rstrip("%"))
        elif pair:
            out[f"{col}_mean"], out[f"{col}_std"] = _float(pair.group(1)), _float(pair.group(2))
        elif isinstance(v, str) and "±" in v:
            out[f"{col}_mean"] = out[f"{col}_std"] = math.nan
        else:
            out[" ".join(m.groups()) if (m := _PAIR.match(col)) else col] = v
    return out


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan
