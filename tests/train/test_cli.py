"""`lmperf train` through a local parser (the lead registers it in lmperf.cli), the summary
table, the findings and the plot."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

from lmperf.errors import SpecError
from lmperf.results.store import read_records
from lmperf.train.cli import PLOT_NAME, add_parser, build_config, resolve_threads
from lmperf.train.config import CPU_DEFAULTS
from lmperf.train.plots import plot_records
from lmperf.train.report import findings, render_summary, summary_table

SMALL = ["--size", "tiny", "--context", "16", "--batch", "2", "--steps", "6", "--warmup-steps", "2",
         "--eval-interval", "3", "--eval-batches", "1"]


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="lmperf")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    return parser.parse_args(["train", *argv])


def _train(argv: list[str], tmp_path) -> int:
    args = _parse([*argv, "--out", str(tmp_path / "train.jsonl"), "--plots", str(tmp_path / "plots")])
    return args.func(args)


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """One small run of three regimes, one of which (fp16-true) fails; shared by several tests."""
    tmp = tmp_path_factory.mktemp("cli")
    capture = pytest.MonkeyPatch()
    import io
    import sys

    out, err = io.StringIO(), io.StringIO()
    capture.setattr(sys, "stdout", out)
    capture.setattr(sys, "stderr", err)
    try:
        code = _train([*SMALL, "--regime", "fp32", "fp16-mixed", "fp16-true", "--device", "cpu"], tmp)
    finally:
        capture.undo()
    return {"code": code, "out": out.getvalue(), "err": err.getvalue(), "dir": tmp,
            "records": read_records(tmp / "train.jsonl")}


def test_cli_prints_table_appends_records_and_draws(cli_run):
    assert cli_run["code"] == 0
    out, err, records = cli_run["out"], cli_run["err"], cli_run["records"]
    assert [r["spec"]["regime"] for r in records] == ["fp32", "fp16-mixed", "fp16-true"]
    assert all(r["kind"] == "train" and r["status"] == "ok" for r in records)
    assert len({r["run_id"] for r in records}) == 1
    assert records[0]["spec"]["data"]["source"] == "builtin"
    for regime in ("fp32", "fp16-mixed", "fp16-true"):
        assert regime in out
    assert "non_finite_loss @ step 2" in out and "peak RSS MiB (CPU process)" in out
    assert "warning: fp16-mixed on the CPU" in err  # fp16 is opt-in on the CPU, with a warning
    assert "step     3/6" in err and "fp16-true: non_finite_loss @ step 2" in err
    png = cli_run["dir"] / "plots" / PLOT_NAME
    assert png.stat().st_size > 20_000 and str(png) in err


def test_summary_and_findings_from_records(cli_run):
    records = cli_run["records"]
    table = summary_table(records)
    assert list(table["regime"]) == ["fp32", "fp16-mixed", "fp16-true"]
    assert list(table["steps"]) == [6, 6, 2]
    assert table.loc[1, "final scale"] == "65536" and table.loc[0, "final scale"] == "-"
    assert table.loc[2, "val loss"].endswith("(@0)")  # the last validation was before the stop
    notes = " ".join(findings(records))
    assert "fp16-true stopped with non_finite_loss" in notes
    assert "eps 1e-08 rounds to 0 in float16" in notes
    assert "GradScaler's scale went from 65536 to 65536; 0 of 6 steps were skipped" in notes
    assert render_summary(records, "markdown").count("| fp") == 3


def test_plot_redraws_from_the_jsonl_records(cli_run, tmp_path):
    path = plot_records(cli_run["records"], tmp_path / "again.png")
    assert path.stat().st_size > 20_000


def test_text_file_and_markdown(tmp_path, capsys):
    data = tmp_path / "story.txt"
    data.write_text("Once upon a time there was a tiny model. " * 40)
    code = _train([*SMALL, "--regime", "bf16-mixed", "--data", str(data), "--format", "markdown",
                   "--no-plots", "--threads", "2"], tmp_path)
    out = capsys.readouterr().out
    assert code == 0 and "| bf16-mixed" in out and "text data" in out and "(2 threads)" in out
    assert read_records(tmp_path / "train.jsonl")[0]["env"]["torch_threads"] == 2
    assert torch.get_num_threads() == 1  # restored after the run
    assert not (tmp_path / "plots").exists()


def test_token_file_uses_the_course_vocabulary(tmp_path, capsys):
    tokens = tmp_path / "ids.bin"
    ids = (np.arange(4000) * 37 % 9999).astype(np.uint16)
    ids.tofile(tokens)
    code = _train([*SMALL, "--steps", "3", "--regime", "fp32", "--tokens", str(tokens), "--no-plots"],
                  tmp_path)
    record = read_records(tmp_path / "train.jsonl")[0]
    assert code == 0 and record["spec"]["vocab_size"] == 10_000
    assert record["spec"]["data"]["source"] == "tokens" and record["spec"]["data"]["max_id"] == ids.max()


def test_defaults_on_the_cpu():
    cfg = build_config(_parse([]), "cpu")
    assert cfg.regimes == CPU_DEFAULTS["regimes"] and cfg.size == CPU_DEFAULTS["size"]
    assert (cfg.context, cfg.batch, cfg.steps, cfg.vocab_size) == (
        CPU_DEFAULTS["context"], CPU_DEFAULTS["batch"], CPU_DEFAULTS["steps"], 256)
    assert build_config(_parse([]), "cuda").regimes[-1] == "fp16-true"
    assert resolve_threads(_parse([]), "cpu") == 1 and resolve_threads(_parse([]), "cuda") is None
    assert resolve_threads(_parse(["--threads", "2"]), "cpu") == 2


@pytest.mark.parametrize("argv,match", [
    (["--steps", "0"], "--steps must be a positive integer"),
    (["--context", "-4"], "--context must be a positive integer"),
    (["--lr", "-1"], "--lr must be a positive number"),
    (["--regime", "fp8"], "unknown regime 'fp8'"),
    (["--size", "huge"], "unknown size 'huge'"),
    (["--log-every", "-1"], "--log-every"),
    (["--threads", "0"], "--threads must be a positive integer"),
    (["--data", "/nonexistent/x.txt"], "no such file"),
])
def test_bad_options_are_one_line_spec_errors(argv, match, tmp_path):
    with pytest.raises(SpecError, match=match) as exc:
        _train(argv, tmp_path)
    assert "\n" not in str(exc.value)
    assert not (tmp_path / "train.jsonl").exists()  # nothing ran, nothing was written


def test_bad_token_files_are_spec_errors(tmp_path):
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    with pytest.raises(SpecError, match="is empty"):
        _train(["--tokens", str(empty)], tmp_path)
    big = tmp_path / "big.bin"
    np.array([1, 2, 3, 12_345] * 100, dtype=np.uint16).tofile(big)
    with pytest.raises(SpecError, match="token id 12345"):
        _train(["--tokens", str(big)], tmp_path)


def test_data_and_tokens_are_exclusive(capsys):
    with pytest.raises(SystemExit) as exc:
        _parse(["--data", "a.txt", "--tokens", "b.bin"])
    assert exc.value.code == 2 and "not allowed with" in capsys.readouterr().err
