"""Issue 36's small ones, each failing on e10cc18: the answer first (the headline, then the
brief tables, the rest behind --details), no line printed twice, `memory --estimate`'s "fits"
in its default table, no analytic-terms table for a model without terms, --out refused before
anything starts in every command, and a sweep's noise warnings as one line."""

from __future__ import annotations

import re

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from lmperf.cli import main
from lmperf.core.report import Report

REPO = Path(__file__).resolve().parents[2]


def _lines(text: str) -> list[str]:
    """The lines of a rendering that are not table rows or blank."""
    return [line for line in text.splitlines() if line.strip() and not line.startswith("|")]


@pytest.mark.parametrize("fmt", ["text", "markdown", "latex"])
def test_no_line_is_printed_twice(fmt):
    df = pd.DataFrame({"x": [1, 2]})
    report = Report(kind="demo", frame=df, title="t",
                    findings=["winner: a", "run it: `lmperf bench --size tiny`", "winner: a"],
                    display=lambda r: (r.frame, "", ["a note", "a note"]))
    lines = _lines(report.render(fmt))
    assert len(lines) == len(set(lines)), lines
    assert sum("winner: a" in line for line in lines) == 1


def test_the_headline_comes_first_in_every_human_format_and_once():
    df = pd.DataFrame({"x": range(30), "y": range(30)})
    report = Report(kind="demo", frame=df, title="main", tables={"more": df, "brief": df},
                    findings=["the answer: 42", "a finding"], headline=["the answer: 42"],
                    brief={"more": None, "brief": (["x"], 2)})
    text = report.render("text")
    assert text.startswith("the answer: 42\n\nmain\n") and text.count("the answer: 42") == 1
    assert "more table(s) (more): --details" in text and "28 more rows; 1 more columns (y)" in text
    full = report.render("text", details=True)  # every table, every row (the brief's columns)
    assert full.count("\n29  29") == 2 and "\n29\n" in full and "--details" not in full
    assert report.render("markdown").startswith("**the answer: 42**")
    assert report.render("latex").startswith("\\noindent the answer: 42")


def test_a_command_in_a_finding_is_never_wrapped():
    command = "`lmperf dist train --world-size 2 --strategy torch-ddp --size tiny --context 64`"
    report = Report(kind="demo", findings=["run it: " + "x " * 40 + command])
    lines = report.render("text").splitlines()
    assert any(command.strip("`") in line for line in lines), lines  # whole, on one line
    assert not any("`" in line for line in lines)  # copied with backticks it would not run
    assert command in report.render("markdown")


def test_estimate_shows_fits_in_its_default_table_against_this_machine(tmp_path, capsys):
    out = tmp_path / "m.jsonl"
    assert main(["memory", "--estimate", "--size", "tiny", "--context", "32", "--mode",
                 "train-step", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    head = [line for line in text.splitlines() if line.startswith("mode ")][0]
    assert head.split()[-1] == "fits"  # a column of the table printed, not a footnote
    head = " ".join(text.split("\n\n")[0].split())  # the headline, unwrapped
    assert re.search(r"; 1 of 1 fit in [\d.]+ GiB available on this CPU$", head)


def test_gpu_estimate_shows_fits_in_its_default_table(tmp_path, capsys):
    assert main(["memory", "--gpu", "H100-SXM", "--size", "tiny", "--context", "32", "--mode",
                 "train-step", "--out", str(tmp_path / "m.jsonl")]) == 0
    text = capsys.readouterr().out
    assert [line for line in text.splitlines() if line.startswith("mode ")][0].endswith(" fits")
    assert "1 of 1 fit on H100-SXM (80 GiB)" in " ".join(text.split("\n\n")[0].split())


def test_a_model_without_analytic_terms_gets_no_analytic_terms_table(tmp_path, capsys):
    assert main(["memory", "--estimate", "--model", "tests.fixtures.models:bigram", "--context",
                 "32", "--mode", "train-step", "--format", "markdown",
                 "--out", str(tmp_path / "m.jsonl")]) == 0
    text = capsys.readouterr().out
    assert "analytic terms" not in text.replace("The analytic terms explain", "")
    assert "analytic sum" not in text  # no column of dashes either


COMMANDS = [["bench"], ["profile"], ["memory"], ["memory", "--estimate"], ["attention"],
            ["train"], ["amp", "norms"], ["doctor"], ["dist", "comm"],
            ["plan", "--gpu", "H100-SXM"]]


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_a_bad_out_is_refused_before_anything_starts(argv, tmp_path):
    """An --out that is not lmperf's JSON lines: one line, exit 2, and no sweep module loaded
    first (no warm server, no job), nothing written."""
    bad = tmp_path / "table.csv"
    bad.write_text("a,b\n1,2\n")
    probe = ("import sys; from lmperf.cli import main; code = main(sys.argv[1:]); "
             "print(code, 'lmperf.core.sweep' in sys.modules, '-')")
    done = subprocess.run([sys.executable, "-c", probe, *argv, "--out", str(bad)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'src'}"})
    code, swept, _ = done.stdout.split()
    assert code == "2" and swept == "False", (done.stdout, done.stderr)
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"lmperf: error: {bad} exists and ") and "give --out a new file" in line
    assert bad.read_text() == "a,b\n1,2\n"


def test_a_sweeps_noise_warnings_are_one_line_and_each_record_keeps_its_own():
    from rich.console import Console

    from lmperf.core.progress import RichReporter

    console = Console(file=__import__("io").StringIO(), width=200)
    reporter = RichReporter(console)

    class Spec:
        def label(self):
            return "run"

    metrics = {"step_ms": {"median": 1.0, "mean": 1.0, "std": 0.0, "n": 10}, "tokens_per_s": 1.0}
    records = [{"kind": "bench", "status": "ok", "metrics": metrics, "warnings": [w]} for w in (
        "IQR/median forward 54%, step 339%: the environment had a significant influence",
        "IQR/median step 12%: the machine was noisy", "bf16-mixed on this CPU: slow")]
    records.append({"kind": "bench", "status": "ok", "metrics": metrics, "warnings": []})
    reporter.begin(len(records), 0)
    for i, record in enumerate(records):
        reporter.finish(i, Spec(), [record])
    reporter.end()
    out = console.file.getvalue()
    assert "IQR/median forward" not in out and out.count("warning:") == 2
    assert ("warning: 2 of 4 runs noisy, IQR/median up to 339%: the machine was busy; "
            "--rounds 3 interleaves them") in out
    assert "bf16-mixed on this CPU: slow" in out
