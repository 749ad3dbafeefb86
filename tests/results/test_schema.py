"""The record schema: field order and status validation."""

from __future__ import annotations

import json

import pytest

from lmperf.results.schema import SCHEMA_VERSION, STATUSES, make_record

SPEC = {"size": "tiny", "context": 16, "batch": 2}
ENV = {"device": "cpu", "timestamp": "2025-01-01T00:00:00+00:00"}
FIELDS = ["schema", "kind", "status", "message", "spec", "params", "env", "metrics", "warnings"]


def test_make_record_field_order_and_values():
    metrics = {"step_ms": {"mean": 1.0}}
    rec = make_record("bench", SPEC, "ok", ENV, params=1234, metrics=metrics, warnings=["w"])
    assert list(rec) == FIELDS
    assert rec == {
        "schema": SCHEMA_VERSION, "kind": "bench", "status": "ok", "message": "", "spec": SPEC,
        "params": 1234, "env": ENV, "metrics": metrics, "warnings": ["w"],
    }
    assert SCHEMA_VERSION == 3


def test_make_record_defaults_for_a_failed_run():
    rec = make_record("bench", SPEC, "oom", ENV, message="out of memory while measuring")
    assert rec["status"] == "oom"
    assert rec["message"] == "out of memory while measuring"
    assert rec["params"] is None and rec["metrics"] is None
    assert rec["warnings"] == []
    json.dumps(rec, allow_nan=False)  # JSON-ready


def test_make_record_extra_fields_come_last_in_order():
    rec = make_record("bench", SPEC, "error", ENV, message="boom", traceback="tb", log_tail="tail")
    assert list(rec) == FIELDS + ["traceback", "log_tail"]
    assert rec["traceback"] == "tb" and rec["log_tail"] == "tail"


def test_make_record_copies_the_warnings_list():
    warnings = ["slow"]
    rec = make_record("bench", SPEC, "ok", ENV, warnings=warnings)
    warnings.append("added later")
    assert rec["warnings"] == ["slow"]
    # and a fresh list per record (no shared mutable default)
    a, b = make_record("bench", SPEC, "ok", ENV), make_record("bench", SPEC, "ok", ENV)
    a["warnings"].append("x")
    assert b["warnings"] == []


@pytest.mark.parametrize("status", STATUSES)
def test_make_record_accepts_every_status(status):
    assert make_record("bench", SPEC, status, ENV)["status"] == status


@pytest.mark.parametrize("status", ["OK", "failed", "", "skipped"])
def test_make_record_rejects_unknown_status(status):
    with pytest.raises(ValueError, match="unknown status") as info:
        make_record("bench", SPEC, status, ENV)
    for accepted in STATUSES:
        assert accepted in str(info.value)


def test_statuses():
    assert STATUSES == ("ok", "oom", "error", "unsupported")


def test_spec_dict_round_trip_refuses_or_drops_unknown_fields_and_fills_old_ones():
    from dataclasses import dataclass

    from lmperf.errors import SpecError
    from lmperf.results.schema import SpecDict

    @dataclass(frozen=True)
    class Job(SpecDict):
        not_identity = ("timeout_s",)
        old_defaults = {"course": "2025"}
        sizes: tuple[int, ...] = (1,)
        course: str = "2026"
        timeout_s: float = 1.0

    job = Job(sizes=(1, 2), timeout_s=5.0)
    assert job.to_dict() == {"sizes": (1, 2), "course": "2026"}
    assert Job.from_dict(json.loads(json.dumps(job.to_full_dict()))) == job  # lists -> tuples
    assert Job.from_dict({"sizes": [3]}).course == "2025"  # a record from before the field
    with pytest.raises(SpecError, match=r"unknown Job field\(s\): a, b"):
        Job.from_dict({"b": 1, "a": 2})
    Job.drop_unknown = True
    assert Job.from_dict({"b": 1, "course": "2026"}) == Job()
