"""The record schema: field order, status validation, and the record check."""

from __future__ import annotations

import json

import pytest

from lmperf.results.schema import SCHEMA_VERSION, STATUSES, is_record, make_record

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


def test_is_record_true_for_made_records():
    for status in STATUSES:
        assert is_record(make_record("bench", SPEC, status, ENV))
    # survives a JSON round trip
    assert is_record(json.loads(json.dumps(make_record("bench", SPEC, "ok", ENV))))


@pytest.mark.parametrize("obj", [
    None, 1, "record", [], [1, 2], {},
    {"a": 1},
    # each one misses or breaks one required field
    {"schema": 1, "kind": "bench", "status": "ok"},                                   # no spec
    {"schema": 1, "kind": "bench", "status": "ok", "spec": "tiny"},                   # spec not a dict
    {"schema": 1, "kind": "bench", "status": "weird", "spec": {}},                    # bad status
    {"schema": 1, "kind": "bench", "spec": {}},                                       # no status
    {"schema": 1, "status": "ok", "spec": {}},                                        # no kind
    {"kind": "bench", "status": "ok", "spec": {}},                                    # no schema
])
def test_is_record_false_for_non_records(obj):
    assert not is_record(obj)


def test_is_record_minimal_record():
    assert is_record({"schema": 1, "kind": "bench", "status": "ok", "spec": {}})
