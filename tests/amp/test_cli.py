"""`lmperf amp`: the list, one experiment with --json and a record, bad options, `all`'s report."""

from __future__ import annotations

import json

import pytest

from lmperf.questions.amp import EXPERIMENT_NAMES
from lmperf.cli import main


def test_amp_without_experiment_lists_each_with_one_line(capsys):
    assert main(["amp"]) == 0
    out = capsys.readouterr().out
    for name in EXPERIMENT_NAMES + ("all",):
        lines = [ln for ln in out.splitlines() if ln.strip().startswith(name + " ")]
        assert len(lines) == 1, name


def test_one_experiment_prints_records_and_writes_json(capsys, tmp_path):
    out, js = tmp_path / "amp.jsonl", tmp_path / "acc.json"
    assert main(["amp", "accumulate", "--out", str(out), "--json", str(js)]) == 0
    printed = capsys.readouterr().out
    (record,) = json.loads(js.read_text())  # --json FILE: the list of records, as every command
    assert record["kind"] == "amp" and record["status"] == "ok"
    assert record["spec"]["experiment"] == "accumulate" and record["env"]["torch"]
    lines = out.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0]) == record
    # what is printed is what was recorded: every table title appears in the output
    for title in record["metrics"]["tables"]:
        assert title in printed


def test_bad_option_is_one_line_exit_2(capsys, tmp_path):
    code = main(["amp", "stagnation", "--steps", "0", "--out", str(tmp_path / "a.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_unknown_experiment_is_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["amp", "quantum"])
    assert info.value.code == 2
    assert "invalid choice: 'quantum'" in capsys.readouterr().err


def test_all_writes_one_report_with_tables_and_plots(capsys, tmp_path):
    report, out = tmp_path / "report", tmp_path / "amp.jsonl"
    assert main(["amp", "all", "--report", str(report), "--out", str(out)]) == 0
    text = (report / "report.md").read_text()
    for name in EXPERIMENT_NAMES:
        assert f"## {name}" in text
    pngs = sorted(p.name for p in report.glob("*.png"))
    assert pngs and all((report / p).stat().st_size > 1000 for p in pngs)
    for png in pngs:
        assert f"]({png})" in text  # each plot is embedded in the report
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["spec"]["experiment"] for r in records] == list(EXPERIMENT_NAMES)
    assert all(r["status"] == "ok" for r in records)


def test_bare_json_prints_only_the_records_on_stdout(capsys, tmp_path):
    assert main(["amp", "accumulate", "--json", "--out", str(tmp_path / "a.jsonl")]) == 0
    (record,) = json.loads(capsys.readouterr().out)  # nothing but JSON on stdout
    assert record["spec"]["experiment"] == "accumulate" and record["status"] == "ok"


@pytest.mark.parametrize("fmt", ["markdown", "latex", "csv"])
def test_every_format_renders_the_tables(fmt, capsys, tmp_path):
    assert main(["amp", "accumulate", "--format", fmt, "--out", str(tmp_path / "a.jsonl")]) == 0
    out = capsys.readouterr().out
    if fmt == "csv":
        import io

        import pandas as pd

        df = pd.read_csv(io.StringIO(out))
        assert len(df) >= 1 and "accumulator_dtype" in df.columns
    else:
        assert "fp16 += fp16" in out and ("\\begin{tabular}" in out if fmt == "latex" else "|" in out)


def test_plots_dir(capsys, tmp_path):
    assert main(["amp", "underflow", "--plots", str(tmp_path / "p"), "--out", str(tmp_path / "a.jsonl")]) == 0
    assert (tmp_path / "p" / "underflow.png").stat().st_size > 1000


def test_the_python_api_returns_a_report():
    import lmperf

    report = lmperf.amp("accumulate", n=100, addend=0.01)
    assert report.frame["n"].iloc[0] == 100 and report.findings
    assert report.records[0]["spec"]["experiment"] == "accumulate"
    from lmperf.errors import SpecError

    with pytest.raises(SpecError, match="unknown option"):
        lmperf.amp("accumulate", bogus=1)


def test_bad_value_is_refused_before_anything_runs(capsys, tmp_path):
    out = tmp_path / "a.jsonl"
    code = main(["amp", "norms", "--dim", "1", "--out", str(out)])
    assert code == 2 and "--dim" in capsys.readouterr().err
    assert not out.exists()  # nothing ran, nothing written


def test_every_experiment_checks_its_options_without_running():
    import inspect

    from lmperf.questions.amp import get_experiment

    for name in EXPERIMENT_NAMES:
        module = get_experiment(name)
        # check() takes run()'s options with run()'s defaults, so the parent can refuse bad input
        assert (inspect.signature(module.check).parameters.keys()
                == inspect.signature(module.run).parameters.keys()), name


def test_all_keeps_going_when_an_experiment_raises_inside_torch(capsys, tmp_path, monkeypatch):
    """An exception raised by torch during a measurement (a ValueError here) is that
    experiment's error row; every other experiment still runs and is recorded."""
    import torch

    from lmperf.questions.amp import get_experiment
    from lmperf.questions.amp.base import ExperimentResult

    ran: list[str] = []

    def fake(name):
        def run(device, **options):
            ran.append(name)
            return ExperimentResult(name, {"fake": True}, notes=[f"{name} ran"])
        return run

    def raises_in_torch(device, **options):
        ran.append("softmax")
        torch.optim.AdamW([], lr=0.1)  # torch: ValueError("optimizer got an empty parameter list")

    for name in EXPERIMENT_NAMES:
        module = get_experiment(name)
        monkeypatch.setattr(module, "run", raises_in_torch if name == "softmax" else fake(name))
        monkeypatch.delattr(module, "plot", raising=False)
    out = tmp_path / "amp.jsonl"
    code = main(["amp", "all", "--inline", "--out", str(out), "--report", str(tmp_path / "rep")])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert ran == list(EXPERIMENT_NAMES)
    assert [r["spec"]["experiment"] for r in records] == list(EXPERIMENT_NAMES)
    bad = [r for r in records if r["status"] != "ok"]
    assert [(r["spec"]["experiment"], r["status"]) for r in bad] == [("softmax", "error")]
    assert "ValueError" in bad[0]["message"] and "empty parameter list" in bad[0]["message"]
    assert code == 1 and "1 failed: softmax" in capsys.readouterr().err
    assert "**error:**" in (tmp_path / "rep" / "report.md").read_text()
