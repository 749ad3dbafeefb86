"""`lmperf attention` on the command line: tables, plots, records, oom rows, --json, `lmperf
table`, and bad input (the removed flag names: tests/core/test_vocabulary.py)."""

from __future__ import annotations

import argparse
import io
import json
import re

import pandas as pd
import pytest

from lmperf.questions.attention.cli import add_parser
from lmperf.errors import SpecError
from tests.conftest import CPU_CAP_GIB

TINY = ["--d", "16", "--warmup", "0", "--steps", "2", "--device", "cpu"]


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="lmperf")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["attention", *argv])
    return args.func(args)


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_tiny_sweep_end_to_end(tmp_path, capsys):
    out, plots = tmp_path / "r" / "attention.jsonl", tmp_path / "plots"
    argv = ["--attention", "naive", "flash-torch", "--context", "32", *TINY, "--out", str(out)]
    assert _run([*argv, "--plots", str(plots)]) == 0
    records = _lines(out)
    assert [(r["spec"]["attention"], r["spec"]["context"], r["status"]) for r in records] == [
        ("naive", 32, "ok"), ("flash-torch", 32, "ok")]
    assert all(r["spec"]["threads"] == 1 and r["spec"]["causal"] for r in records)
    assert all(r["env"]["torch_threads"] == 1 for r in records)
    captured = capsys.readouterr()
    first = captured.out.splitlines()[:2]  # the answer first: the fastest, then the memory
    assert re.match(r"fastest fwd\+bwd at context 32: (naive|flash-torch) [\d.]+ ms", first[0])
    assert first[1].startswith("memory before backward at context 32: flash-torch ")
    assert "P matrix (analytic)" not in captured.out  # the tables against context: --details
    assert "2 configuration(s): 2 ok" in captured.err
    assert _run([*argv, "--resume", "--details"]) == 0  # every table, as Markdown has them
    detail = capsys.readouterr().out
    for title in ("forward latency", "backward latency", "fwd+bwd latency",
                  "memory before backward", "P matrix (analytic)", "speedup of fwd+bwd over naive"):
        assert title in detail
    assert sorted(p.name for p in plots.iterdir()) == [
        "latency_vs_seq.png", "memory_vs_seq.png", "speedup_vs_seq.png"]
    # resume: everything is ok already, nothing runs and nothing is appended
    assert len(_lines(out)) == 2


def test_a_configuration_that_does_not_fit_is_an_oom_row_and_exit_0(tmp_path, capfd, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    out = tmp_path / "a.jsonl"
    # one 16384^2 fp32 score matrix is 1 GiB: over the 1.5 GiB cap once torch is loaded;
    # flash-triton without a GPU or the interpreter is 'unsupported' without a child
    code = _run(["--attention", "naive", "flash-triton", "--context", "16384", *TINY,
                 "--max-memory-gib", str(CPU_CAP_GIB), "--out", str(out)])
    assert code == 0
    records = _lines(out)
    assert [r["status"] for r in records] == ["oom", "unsupported"]
    assert "out of memory while timing the forward" in records[0]["message"]
    assert f"capped at {CPU_CAP_GIB:g} GiB" in records[0]["memory_cap"]
    assert records[0]["metrics"]["analytic"]["score_matrix_mib"] == 1024
    captured = capfd.readouterr()
    assert "oom [1]" in captured.out and "unsupported [2]" in captured.out
    assert "Traceback" not in captured.out + captured.err


def test_bare_json_prints_only_the_records(tmp_path, capsys):
    out = tmp_path / "a.jsonl"
    assert _run(["--attention", "sdpa", "--context", "16", *TINY, "--inline", "--out", str(out),
                 "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == _lines(out) and printed[0]["kind"] == "attention"


@pytest.fixture(scope="module")
def results_file(tmp_path_factory):
    """A results file with an ok row, an unsupported row and two shapes (made once)."""
    out = tmp_path_factory.mktemp("table") / "attention.jsonl"
    _run(["--attention", "naive", "sdpa", "--context", "16", "32", "--d", "8", "--warmup", "0",
          "--steps", "1", "--device", "cpu", "--inline", "--out", str(out)])
    with pytest.MonkeyPatch.context() as mp:  # no GPU, no interpreter: an 'unsupported' row
        mp.delenv("TRITON_INTERPRET", raising=False)
        _run(["--attention", "flash-triton", "--dtype", "fp32", "--context", "16", "--d",
              "8", "--device", "cpu", "--inline", "--out", str(out)])
    return out


@pytest.mark.parametrize("fmt, expect", [("latex", r"\begin{tabular}"),
                                         ("markdown", "#### memory before backward"),
                                         ("csv", "attention,context,")])
def test_lmperf_table_renders_attention_records(results_file, fmt, expect, capsys):
    from lmperf.cli import main

    assert main(["table", str(results_file), "--format", fmt]) == 0
    text = capsys.readouterr().out
    assert expect in text
    if fmt == "csv":
        df = pd.read_csv(io.StringIO(text))
        assert len(df) == 5 and set(df["status"]) == {"ok", "unsupported"}
        assert df.loc[df["attention"] == "sdpa", "speedup_vs_naive"].notna().all()


@pytest.mark.parametrize("argv, match", [
    (["--context", "0"], "--context must be a positive integer"),
    (["--attention", "flash"], "unknown attention implementation 'flash'"),
    (["--dtype", "fp8"], "--dtype: unknown"),
    (["--timeout", "-1"], "--timeout must be a positive number"),
    (["--max-memory-gib", "0"], "--max-memory-gib must be a positive number"),
    (["--batch", "0"], "--batch must be a positive integer"),
    (["--warmup", "-1"], "--warmup must be a non-negative"),
    (["--steps", "0"], "--steps must be a positive integer"),
])
def test_bad_input_is_a_spec_error_before_anything_runs(tmp_path, argv, match):
    out = tmp_path / "a.jsonl"
    with pytest.raises(SpecError, match=match):
        _run([*argv, "--device", "cpu", "--out", str(out)])
    assert not out.exists()
