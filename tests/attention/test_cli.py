"""`lmperf attention` through its own parser: tables, plots, records, bad input."""

from __future__ import annotations

import argparse
import json

import pytest

from lmperf.attention.cli import add_parser
from lmperf.errors import SpecError


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="lmperf")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["attention", *argv])
    return args.func(args)


def test_a_tiny_sweep_end_to_end(tmp_path, capsys):
    out, plots = tmp_path / "r" / "attention.jsonl", tmp_path / "plots"
    code = _run(["--impl", "naive", "flash-torch", "--seq", "32", "64", "--d", "16", "--warmup", "0",
                 "--repeats", "2", "--device", "cpu", "--out", str(out), "--plots", str(plots)])
    assert code == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["spec"]["impl"], r["spec"]["seq"], r["status"]) for r in records] == [
        ("naive", 32, "ok"), ("naive", 64, "ok"), ("flash-torch", 32, "ok"), ("flash-torch", 64, "ok")]
    assert all(r["spec"]["threads"] == 1 and r["spec"]["causal"] for r in records)
    text = capsys.readouterr().out
    for title in ("forward latency", "backward latency", "fwd+bwd latency",
                  "memory before backward", "P matrix (analytic)", "speedup of fwd+bwd over naive",
                  "naive minus flash-torch"):
        assert title in text
    assert sorted(p.name for p in plots.iterdir()) == [
        "latency_vs_seq.png", "memory_vs_seq.png", "speedup_vs_seq.png"]
    # resume: everything is ok already
    assert _run(["--impl", "naive", "flash-torch", "--seq", "32", "64", "--d", "16", "--warmup",
                 "0", "--repeats", "2", "--out", str(out), "--resume", "--device", "cpu"]) == 0
    assert len(out.read_text().splitlines()) == 4


@pytest.mark.parametrize("argv, match", [
    (["--seq", "0"], "seq must be a positive integer"),
    (["--impl", "flash"], "unknown attention implementation 'flash'"),
    (["--dtype", "fp8"], "unknown dtype 'fp8'"),
    (["--timeout", "-1"], "--timeout must be positive"),
    (["--max-memory-gib", "0"], "--max-memory-gib must be positive"),
    (["--batch", "0"], "batch must be a positive integer"),
])
def test_bad_input_is_a_spec_error_before_anything_runs(tmp_path, argv, match):
    out = tmp_path / "a.jsonl"
    with pytest.raises(SpecError, match=match):
        _run([*argv, "--device", "cpu", "--out", str(out)])
    assert not out.exists()


def test_markdown_and_csv_formats(tmp_path, capsys):
    base = ["--impl", "naive", "--seq", "16", "--d", "8", "--warmup", "0", "--repeats", "1",
            "--inline", "--device", "cpu", "--out", str(tmp_path / "a.jsonl")]
    _run([*base, "--format", "markdown"])
    assert "#### memory before backward" in capsys.readouterr().out
    _run([*base, "--format", "csv"])
    assert capsys.readouterr().out.startswith("impl,seq,")
