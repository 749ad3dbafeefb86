"""`lmperf train` through a local parser (the lead registers it in lmperf.cli), its Report
(summary table, findings, plot), records of schema 1, --json, and an oom row in a child."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from lmperf.core.vocabulary import DEFAULTS
from lmperf.errors import SpecError
from lmperf.results.store import read_records
from lmperf.questions.train.api import PLOT_NAME
from lmperf.questions.train.cli import add_parser
from tests.fixtures.defaults import with_api_defaults
from lmperf.questions.train.plots import plot_records
from lmperf.questions.train.report import build_report, findings, summary_table
from tests.conftest import CPU_CAP_GIB

SMALL = ["--size", "tiny", "--context", "16", "--batch", "2", "--steps", "6", "--lr-warmup", "2",
         "--eval-interval", "3", "--eval-batches", "1", "--inline"]
REPO = Path(__file__).resolve().parents[2]


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
    out, err = io.StringIO(), io.StringIO()
    capture.setattr(sys, "stdout", out)
    capture.setattr(sys, "stderr", err)
    try:
        code = _train([*SMALL, "--precision", "fp32", "fp16-mixed", "fp16-true", "--device", "cpu"],
                      tmp)
    finally:
        capture.undo()
    return {"code": code, "out": out.getvalue(), "err": err.getvalue(), "dir": tmp,
            "records": read_records(tmp / "train.jsonl")}


def test_cli_prints_table_appends_records_and_draws(cli_run):
    assert cli_run["code"] == 0
    out, err, records = cli_run["out"], cli_run["err"], cli_run["records"]
    assert [r["spec"]["precision"] for r in records] == ["fp32", "fp16-mixed", "fp16-true"]
    assert all(r["kind"] == "train" and r["status"] == "ok" and r["job_id"] for r in records)
    assert records[0]["corpus"]["source"] == "builtin" and records[0]["spec"]["threads"] == 1
    for regime in ("fp32", "fp16-mixed", "fp16-true"):
        assert regime in out
    # the status cell may be cut to fit 120 columns, depending on the other cells' widths (the
    # step times of this machine); the finding names the step
    assert "non_finite_loss" in out and "nan at step 2" in out and "peak RSS MiB" in out
    assert "step ms: median (mean)" in " ".join(out.split())  # the median first (issue 28)
    assert "warning: fp16-mixed on the CPU" in err  # fp16 is opt-in on the CPU, with a warning
    assert "step     3/6" in err and "fp16-true: non_finite_loss @ step 2" in err
    assert "3 regime(s): 3 ok; records appended to" in " ".join(err.split())
    png = cli_run["dir"] / "plots" / PLOT_NAME
    assert png.stat().st_size > 20_000 and str(png) in err


def test_train_opens_with_the_losses_and_step_times(cli_run):
    """Issue 43 (8): train opened with a title; now the answer, with its figures."""
    head = " ".join(cli_run["out"].split("\n\n")[0].split())  # the headline, unwrapped
    assert head.startswith("validation loss after 6 steps (tiny, B=2 T=16): fp32 ")
    assert "fp16-mixed " in head and "fp16-true stopped at step 2 (non_finite_loss)" in head
    assert " median step: fp32 " in head and " ms; fp16-mixed " in head


def test_summary_and_findings_from_records(cli_run):
    records = cli_run["records"]
    table = summary_table(records)
    assert list(table["precision"]) == ["fp32", "fp16-mixed", "fp16-true"]
    assert list(table["steps"]) == [6, 6, 2]
    assert table.loc[1, "final scale"] == "65536" and table.loc[0, "final scale"] == "-"
    assert table.loc[2, "val loss"].endswith("(@0)")  # the last validation was before the stop
    notes = " ".join(findings(records))
    assert "fp16-true stopped with non_finite_loss" in notes
    assert "eps 1e-08 rounds to 0 in float16" in notes
    assert "GradScaler's scale went from 65536 to 65536; 0 of 6 steps were skipped" in notes
    markdown = build_report(records).render("markdown").splitlines()
    assert sum(line.startswith("| fp") for line in markdown) == 3


def test_report_frame_and_tables_are_numeric(cli_run):
    report = build_report(cli_run["records"])
    frame = report.frame
    assert list(frame["precision"]) == ["fp32", "fp16-mixed", "fp16-true"]
    assert list(frame["steps_run"]) == [6, 6, 2]
    for col in ("final_loss", "final_val_loss", "step_ms_median", "tokens_per_s", "peak_mib"):
        assert frame[col].dtype == float, col
    assert frame.loc[1, "final_scale"] == 65536.0 and np.isnan(frame.loc[0, "final_scale"])
    val = report.table("validation loss per step")
    assert list(val["step"]) == [0, 3, 6] and list(val.columns) == ["step", *frame["precision"]]
    assert np.isnan(val.loc[2, "fp16-true"])  # stopped at step 2: never evaluated again


@pytest.mark.parametrize("fmt", ["latex", "csv", "markdown"])
def test_lmperf_table_renders_a_train_results_file(cli_run, fmt, capsys):
    import pandas as pd

    from lmperf.cli import main

    path = cli_run["dir"] / "train.jsonl"
    assert main(["table", str(path), "--format", fmt]) == 0
    text = capsys.readouterr().out
    assert text.strip()
    if fmt == "csv":
        frame = pd.read_csv(io.StringIO(text))
        assert list(frame["precision"]) == ["fp32", "fp16-mixed", "fp16-true"]
    elif fmt == "latex":
        assert "\\begin{tabular}" in text and "fp16-mixed" in text
    else:
        assert text.count("| fp") >= 3


def test_records_written_before_the_rename_still_render(cli_run):
    """Files written before issue 10 (schema 1): spec 'regime' and 'warmup_steps', corpus facts
    in spec 'data'; migrated on read (`results.record.migrate`)."""
    from lmperf.results.record import migrate

    old = []
    for r in cli_run["records"]:
        spec = {("regime" if k == "precision" else "warmup_steps" if k == "lr_warmup" else k): v
                for k, v in r["spec"].items() if k not in ("threads", "tokens")}
        spec["data"] = r["corpus"]
        old.append({k: v for k, v in {**r, "spec": spec, "schema": 1}.items()
                    if k not in ("corpus", "job_id")})
    report = build_report(migrate(old))
    assert list(report.frame["precision"]) == ["fp32", "fp16-mixed", "fp16-true"]
    assert "builtin data (288,000 train" in report.render("text")
    assert report.render("csv").count("\n") == 4


def test_plot_redraws_from_the_jsonl_records(cli_run, tmp_path):
    path = plot_records(cli_run["records"], tmp_path / "again.png")
    assert path.stat().st_size > 20_000


def test_text_file_and_markdown(tmp_path, capsys):
    data = tmp_path / "story.txt"
    data.write_text("Once upon a time there was a tiny model. " * 40)
    code = _train([*SMALL, "--precision", "bf16-mixed", "--data", str(data), "--format",
                   "markdown", "--no-plots", "--threads", "2"], tmp_path)
    out = capsys.readouterr().out
    assert code == 0 and "| bf16-mixed" in out and "text data" in out and "(2 threads)" in out
    record = read_records(tmp_path / "train.jsonl")[0]
    assert record["env"]["torch_threads"] == 2 and record["spec"]["data"] == str(data)
    assert torch.get_num_threads() == 1  # restored after the run
    assert not (tmp_path / "plots").exists()


def test_token_file_uses_the_course_vocabulary(tmp_path, capsys):
    tokens = tmp_path / "ids.bin"
    ids = (np.arange(4000) * 37 % 9999).astype(np.uint16)
    ids.tofile(tokens)
    code = _train([*SMALL, "--steps", "3", "--precision", "fp32", "--tokens", str(tokens),
                   "--no-plots"], tmp_path)
    record = read_records(tmp_path / "train.jsonl")[0]
    assert code == 0 and record["spec"]["vocab_size"] == 10_000
    assert record["corpus"]["source"] == "tokens" and record["corpus"]["max_id"] == ids.max()


def test_bare_json_prints_only_the_records(tmp_path, capsys):
    code = _train([*SMALL, "--steps", "2", "--precision", "fp32", "--no-plots", "--json"], tmp_path)
    out = capsys.readouterr().out
    records = json.loads(out)  # nothing but JSON on stdout
    assert code == 0 and len(records) == 1 and records[0]["kind"] == "train"
    assert records == read_records(tmp_path / "train.jsonl")


def plan_train(**options):
    """plan_train with lmperf.train's defaults for the keywords not given (it has none)."""
    from lmperf.questions.train.api import train
    from lmperf.questions.train.plan import plan_train as plan

    return with_api_defaults(plan, train, **options)


def test_defaults_on_the_cpu(monkeypatch, tmp_path):
    from tests.fixtures.lowp import SAPPHIRE_RAPIDS, simulate_cpu

    simulate_cpu(monkeypatch, tmp_path, SAPPHIRE_RAPIDS)  # native bf16: every default regime
    cpu = DEFAULTS["train"]["cpu"]
    specs = plan_train(device="cpu").specs
    assert [s.precision for s in specs] == cpu["precision"]
    s = specs[0]
    assert (s.size, s.context, s.batch, s.steps) == (cpu["size"], cpu["context"], cpu["batch"],
                                                     cpu["steps"])
    assert (s.vocab_size, s.threads, s.lr_warmup) == (256, 1, 20)  # one CPU thread by default
    assert [s.precision for s in plan_train(device="cpu", precision=["fp32", "fp32"]).specs] == [
        "fp32"]  # a regime listed twice trains once


@pytest.mark.parametrize("argv,match", [
    (["--steps", "0"], "--steps must be a positive integer"),
    (["--context", "-4"], "--context must be a positive integer"),
    (["--lr", "-1"], "--lr must be a positive number"),
    (["--precision", "fp8"], "unknown precision 'fp8'"),
    (["--size", "huge"], "unknown size 'huge'"),
    (["--threads", "-1"], "--threads must be a non-negative integer"),
    (["--timeout", "0"], "--timeout must be a positive number"),
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


def test_a_run_that_does_not_fit_is_an_oom_row(tmp_path):
    """The real command, each regime in its child process under a 1.5 GiB address-space cap:
    the validation forward at step 0 needs 1 GiB for one layer's attention scores alone
    (B=256 x 4 heads x 512 x 512 fp32), so it fails the same way on any machine, quickly."""
    out = tmp_path / "train.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "lmperf", "train", "--size", "tiny", "--context", "512", "--batch",
         "256", "--precision", "fp32", "--steps", "1", "--eval-batches", "1",
         "--max-memory-gib", str(CPU_CAP_GIB), "--out", str(out), "--no-plots", "--device", "cpu"],
        capture_output=True, text=True, cwd=tmp_path, env=os.environ.copy(), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stdout + done.stderr
    (record,) = read_records(out)
    assert record["status"] == "oom" and "traceback" not in record
    assert record["message"].startswith("out of memory while evaluating at step 0")
    assert "1 regime(s): 1 oom" in done.stderr and "oom" in done.stdout


@pytest.mark.parametrize("extra, expected", [
    ([], "sub/train-plots"),                # beside --out, not ./results
    (["--plots", "mine"], "mine"),
    (["--no-plots"], None),
])
def test_plots_go_beside_out_unless_named(monkeypatch, tmp_path, extra, expected):
    import lmperf.questions.train.api as api
    from lmperf.core.report import Report

    seen = {}

    def fake_train(**kwargs):
        seen["plots"] = kwargs["plots"]
        return Report(kind="train")

    monkeypatch.setattr(api, "train", fake_train)
    monkeypatch.chdir(tmp_path)
    args = _parse(["--out", "sub/train.jsonl", *extra])
    args.func(args)
    assert seen["plots"] == (None if expected is None else Path(expected))
