"""Append-only JSONL results files."""

from __future__ import annotations

import json

import pytest

from lmperf.errors import LmperfError, ResultsFileError
from lmperf.results.schema import make_record
from lmperf.results.store import (append_record, ensure_writable, read_records,
                                  spec_key)

ENV = {"device": "cpu", "timestamp": "2025-01-01T00:00:00+00:00"}


def rec(context: int, status: str = "ok", **kw) -> dict:
    spec = {"size": "tiny", "context": context, "batch": 2, "precision": "fp32"}
    if status == "ok":
        kw.setdefault("metrics", {})
    return make_record("bench", spec, status, ENV, **kw)


def records() -> list[dict]:
    return [
        rec(16, params=10, metrics={"step_ms": {"mean": 1.5, "samples": [1.0, 2.0]}}),
        rec(32, "oom", message="out of memory while measuring"),
        rec(64, "error", message="RuntimeError: 'quoted' \"text\" and ünïcode ±\nsecond line"),
        rec(128, "unsupported", message="no tf32 here"),
    ]


def test_round_trip_keeps_order_and_content(tmp_path):
    path = tmp_path / "r.jsonl"
    rs = records()
    for r in rs:
        append_record(path, r)
    assert read_records(path) == rs
    assert [r["spec"]["context"] for r in read_records(path)] == [16, 32, 64, 128]


def test_one_line_per_record_and_trailing_newline(tmp_path):
    path = tmp_path / "r.jsonl"
    rs = records()  # one message holds a newline: it must stay escaped inside its line
    for r in rs:
        append_record(path, r)
    raw = path.read_bytes()
    assert raw.endswith(b"\n")
    lines = raw.decode("utf-8").split("\n")
    assert lines[-1] == ""
    assert len(lines[:-1]) == len(rs)
    for line, r in zip(lines[:-1], rs):
        assert json.loads(line) == r


def test_appending_never_rewrites_earlier_lines(tmp_path):
    path = tmp_path / "r.jsonl"
    previous = b""
    for r in records():
        append_record(path, r)
        now = path.read_bytes()
        assert now.startswith(previous) and len(now) > len(previous)
        previous = now


def test_append_keeps_existing_foreign_content(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"")  # existing (empty) file
    append_record(path, rec(16))
    first = path.read_bytes()
    append_record(path, rec(32))
    assert path.read_bytes()[: len(first)] == first


def test_append_rejects_nan_and_leaves_file_untouched(tmp_path):
    path = tmp_path / "r.jsonl"
    append_record(path, rec(16))
    before = path.read_bytes()
    bad = rec(32, metrics={"tflops": float("nan")})
    with pytest.raises((ValueError, ResultsFileError)):
        append_record(path, bad)
    assert path.read_bytes() == before  # no partial or non-standard JSON line was written


def test_append_to_a_directory_raises_results_file_error(tmp_path):
    with pytest.raises(ResultsFileError, match="cannot write results"):
        append_record(tmp_path, rec(16))


def test_blank_lines_are_ignored(tmp_path):
    path = tmp_path / "r.jsonl"
    a, b = rec(16), rec(32)
    path.write_text("\n" + json.dumps(a) + "\n\n   \n" + json.dumps(b) + "\n\n", encoding="utf-8")
    assert read_records(path) == [a, b]


def test_empty_file_has_no_records(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text("", encoding="utf-8")
    assert read_records(path) == []


def test_corrupt_line_names_its_line_number(tmp_path):
    path = tmp_path / "r.jsonl"
    for r in records()[:2]:
        append_record(path, r)
    with open(path, "a", encoding="utf-8") as f:
        f.write('not a record\n')  # a line no lmperf write produced (line 3)
    append_record(path, rec(256))
    with pytest.raises(ResultsFileError) as info:
        read_records(path)
    msg = str(info.value)
    assert "line 3 " in msg and "not valid JSON" in msg
    assert str(path) in msg


def test_line_numbers_count_blank_lines(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text("\n" + json.dumps(rec(16)) + "\n\n{oops\n", encoding="utf-8")
    with pytest.raises(ResultsFileError, match=r"line 4 is not valid JSON"):
        read_records(path)


@pytest.mark.parametrize("line", [
    '{"a": 1}',
    "[1, 2, 3]",
    "42",
    '"a string"',
    "null",
    '{"schema": 1, "kind": "bench", "status": "finished", "spec": {}}',
    '{"schema": 1, "kind": "bench", "status": "ok", "spec": "tiny"}',
])
def test_json_line_that_is_not_a_record(tmp_path, line):
    path = tmp_path / "r.jsonl"
    append_record(path, rec(16))
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
    with pytest.raises(ResultsFileError, match=r"r.jsonl line 2 is (not an lmperf record|a bench record with unknown status|a bench record whose spec)"):
        read_records(path)


def test_missing_file(tmp_path):
    path = tmp_path / "nope" / "r.jsonl"
    with pytest.raises(ResultsFileError, match="does not exist") as info:
        read_records(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, LmperfError)


def test_undecodable_file(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"\xff\xfe\x00garbage\n")
    with pytest.raises(ResultsFileError):
        read_records(path)


def test_spec_key_independent_of_key_order():
    a = {"size": "tiny", "batch": 2, "context": 16, "nested": {"x": 1, "y": 2}}
    b = {"nested": {"y": 2, "x": 1}, "context": 16, "batch": 2, "size": "tiny"}
    assert list(a) != list(b)
    assert spec_key("bench", a) == spec_key("bench", b)


def test_spec_key_distinguishes_specs_and_kinds():
    a = {"size": "tiny", "batch": 2}
    assert spec_key("bench", a) != spec_key("bench", {"size": "tiny", "batch": 4})
    assert spec_key("bench", a) != spec_key("profile", a)
    assert spec_key("bench", a) != spec_key("bench", {"size": "tiny", "batch": "2"})
    assert isinstance(spec_key("bench", a), str)
    json.loads(spec_key("bench", a))


def test_ensure_writable_creates_parent_folders(tmp_path):
    path = tmp_path / "a" / "b" / "c" / "r.jsonl"
    ensure_writable(path)
    assert path.parent.is_dir()
    assert path.is_file() and path.read_bytes() == b""


def test_ensure_writable_keeps_existing_content(tmp_path):
    path = tmp_path / "r.jsonl"
    append_record(path, rec(16))
    before = path.read_bytes()
    ensure_writable(path)
    assert path.read_bytes() == before


def test_ensure_writable_parent_is_a_file(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x", encoding="utf-8")
    with pytest.raises(ResultsFileError, match="cannot write results"):
        ensure_writable(blocker / "r.jsonl")
    with pytest.raises(ResultsFileError):
        ensure_writable(blocker / "deeper" / "r.jsonl")
    assert blocker.read_text(encoding="utf-8") == "x"


def test_ensure_writable_directory_path(tmp_path):
    folder = tmp_path / "results"
    folder.mkdir()
    with pytest.raises(ResultsFileError) as info:
        ensure_writable(folder)
    assert str(folder) in str(info.value)
    assert folder.is_dir()


@pytest.mark.parametrize("line, why", [
    ('{"schema":1,"kind":"bench","status":"ok","spec":{}}', "an ok bench record without metrics"),
    ('{"schema":1,"kind":"nonsense","status":"ok","spec":{},"metrics":{}}', "unknown kind 'nonsense'"),
    ('{"schema":9,"kind":"bench","status":"ok","spec":{},"metrics":{}}', "schema 9"),
    ('{"schema":1,"kind":"bench","status":"fine","spec":{}}', "unknown status 'fine'"),
    ('{"schema":1,"kind":"bench","status":"oom","spec":[]}', "spec is not an object"),
])
def test_a_record_that_cannot_be_read_is_named_by_file_and_line(tmp_path, line, why):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(rec(16)) + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(ResultsFileError, match=f"r.jsonl line 2 is .*{why}"):
        read_records(path)


def test_older_records_are_read_in_todays_layout(tmp_path):
    """A record without the fields later versions added (message, env, warnings, params) reads
    with their defaults, so a reader never meets a KeyError."""
    path = tmp_path / "r.jsonl"
    path.write_text('{"schema":1,"kind":"bench","status":"oom","spec":{"size":"tiny"}}\n')
    (r,) = read_records(path)
    assert r["message"] == "" and r["env"] == {} and r["warnings"] == [] and r["metrics"] is None


def test_stored_table_inverts_to_jsonable():
    import math

    from lmperf.results.record import stored_table
    from lmperf.results.schema import to_jsonable

    rows = [{"a": 1.5, "b": math.nan, "d": "text"}, {"a": math.inf, "b": -math.inf, "d": "inf"}]
    back = stored_table("t", json.loads(json.dumps(to_jsonable(rows))))
    assert back["a"].tolist() == [1.5, math.inf] and math.isnan(back["b"][0])
    assert back["b"][1] == -math.inf and back["d"].tolist() == ["text", "inf"]


@pytest.mark.parametrize("command", ["table", "report"])
def test_table_and_report_refuse_a_bad_record_in_one_line(tmp_path, capsys, command):
    from lmperf.cli import main

    path = tmp_path / "r.jsonl"
    path.write_text('{"schema":1,"kind":"bench","status":"ok","spec":{}}\n', encoding="utf-8")
    argv = [command, str(path)] + (["--out", str(tmp_path / "r.html")] if command == "report" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "line 1" in err and "without metrics" in err


def test_a_torn_record_from_an_interrupted_write_is_left_out_and_the_file_goes_on(tmp_path,
                                                                                  capsys):
    # a sweep killed mid-write leaves a prefix of its last line: --resume and the next
    # appends must still work, and nothing complete is lost
    from lmperf.results.store import append_record, ensure_writable, read_records

    out = tmp_path / "r.jsonl"
    good = {"schema": 2, "kind": "bench", "status": "ok", "message": "", "spec": {"size": "tiny"},
            "params": 1, "env": {}, "metrics": {"step_ms": {"median": 1.0}}, "warnings": []}
    append_record(out, good)
    with open(out, "a") as f:
        f.write(json.dumps(good)[:40])  # torn: no end, no newline
    ensure_writable(out)  # still lmperf's file
    assert len(read_records(out)) == 1 and "torn record" in capsys.readouterr().err
    append_record(out, good)  # on a line of its own after the torn one
    assert len(read_records(out)) == 2
    only_torn = tmp_path / "t.jsonl"
    only_torn.write_text(json.dumps(good)[:40])
    ensure_writable(only_torn)  # its one record torn: still lmperf's, not a foreign file
    (tmp_path / "x.jsonl").write_text(json.dumps(good) + "\nnot json at all\n")
    with pytest.raises(ResultsFileError, match="line 2 is not valid JSON"):
        read_records(tmp_path / "x.jsonl")  # not a torn lmperf line: refused, as before


def test_plain_numbers_leave_ids_and_extremes_alone():
    from lmperf.core.report import plain_numbers

    assert plain_numbers("max |err| 2.9e-06 (naive)") == "max |err| 0.0000029 (naive)"
    for text in ("commit 1234e56 ok", "abc-4e5", "x1e-3", "torch 2.13.0+cpu", "5e-300",
                 "8e999"):
        assert plain_numbers(text) == text
    assert plain_numbers("x = -4e5") == "x = -400,000"
