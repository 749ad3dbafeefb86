"""Results files: --out refuses a file that is not lmperf JSONL; folders stand for their *.jsonl."""

from __future__ import annotations

import json

import pytest

from lmperf.cli import main
from lmperf.errors import ResultsFileError
from lmperf.results.schema import make_record
from lmperf.results.store import append_record, ensure_writable, results_files


@pytest.mark.parametrize("text", ["size,step_ms\ntiny,12.5\n", '[{"kind": "bench"}]\n',
                                  '{"rows": 3}\n', "\x89PNG\n"])
def test_out_refuses_an_existing_file_that_is_not_lmperf_jsonl(tmp_path, text):
    path = tmp_path / "existing.csv"
    path.write_text(text)
    with pytest.raises(ResultsFileError, match="exists and"):
        ensure_writable(path)
    assert path.read_text() == text


def test_out_accepts_a_new_an_empty_and_an_lmperf_file(tmp_path):
    new = tmp_path / "sub" / "new.jsonl"
    ensure_writable(new)
    assert new.is_file() and new.read_text() == ""  # its folder made, nothing written
    (tmp_path / "empty.jsonl").write_text("")
    ensure_writable(tmp_path / "empty.jsonl")
    ours = tmp_path / "ours.jsonl"
    append_record(ours, make_record("bench", {"size": "tiny"}, "oom", {}, message="m"))
    before = ours.read_text()
    ensure_writable(ours)
    assert ours.read_text() == before and json.loads(before)["status"] == "oom"  # untouched


def test_bench_out_csv_is_one_line_before_anything_runs(tmp_path, capsys):
    path = tmp_path / "existing.csv"
    path.write_text("a,b\n1,2\n")
    assert main(["bench", "--size", "tiny", "--out", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "existing.csv exists and" in err
    assert path.read_text() == "a,b\n1,2\n"


def test_a_folder_is_its_jsonl_files(tmp_path):
    for name in ("b.jsonl", "a.jsonl", "notes.txt"):
        (tmp_path / name).write_text("")
    assert results_files([tmp_path]) == [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ResultsFileError, match="no \\*.jsonl"):
        results_files([tmp_path / "empty"])


def test_table_and_compare_take_a_folder(tmp_path, capsys):
    results = tmp_path / "results"
    assert main(["bench", "--size", "tiny", "--precision", "fp32", "--context", "16",
                 "--steps", "2", "--warmup", "0", "--batch", "2", "--inline",
                 "--out", str(results / "bench.jsonl")]) == 0
    capsys.readouterr()
    assert main(["table", str(results), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["spec"]["size"] == "tiny"
    assert main(["compare", str(results), str(results / "bench.jsonl")]) == 0
