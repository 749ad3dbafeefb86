"""`lmperf compare` on the command line: formats, --json, --fail-above exit codes, one-line
errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lmperf.cli import main

DATA = Path(__file__).parent / "data"
BASE, AGAIN, TWICE = (str(DATA / f"{n}.jsonl") for n in ("base", "again", "twice"))


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_text_table_and_exit_0(capsys):
    code, out, err = _run(["compare", BASE, AGAIN], capsys)
    assert code == 0
    assert "NEW/BASE [95% CI]" in out and "verdict" in out
    assert "ratio of the medians" in out


def test_fail_above_exits_1_on_a_slower_phase(capsys):
    argv = ["compare", BASE, TWICE, "--ignore", "model"]
    code, out, err = _run(argv + ["--fail-above", "20"], capsys)
    assert code == 1
    assert err.count("slower: ") == 8
    assert "exit code 1" in err
    code, _, err = _run(argv + ["--fail-above", "400"], capsys)
    assert code == 0 and "no phase is slower by more than 400%" in err


def test_fail_above_with_nothing_compared_exits_1_in_one_line(capsys):
    """Issue 43 (2): a CI guard passed (exit 0, "no phase is slower") when no spec matched."""
    code, out, err = _run(["compare", BASE, TWICE, "--fail-above", "20"], capsys)  # model differs
    assert code == 1
    assert out.splitlines()[0].startswith("nothing compared: none of ")
    said = [line for line in err.splitlines() if line.startswith("--fail-above")]
    assert said == ["--fail-above 20: nothing compared (no spec ran ok on both sides); exit code 1"]
    assert "no phase is slower" not in err


def test_by_opens_with_the_answer_and_keeps_the_verdict_at_120_columns(tmp_path, capsys):
    """Issue 43 (3, 8): `compare --by precision` opened with a title, and where a spec field
    varies (here the model) its table was cut at 120 columns before the verdict."""
    ab = tmp_path / "ab.jsonl"
    with ab.open("w") as f:
        for name in ("same_base", "twice"):  # each run twice: as fp32, and again as bf16-mixed
            for line in (DATA / "loaded" / f"{name}.jsonl").read_text().splitlines():
                record = json.loads(line)
                f.write(json.dumps(record) + "\n")
                record["spec"]["precision"] = "bf16-mixed"
                f.write(json.dumps(record) + "\n")
    code, out, _ = _run(["compare", str(ab), "--by", "precision"], capsys)
    first = out.splitlines()[0]
    assert code == 0 and first.startswith("NEW precision=bf16-mixed vs BASE precision=fp32: ")
    assert re.search(r"\d\.\d{3}x", first)  # the ratio, a figure, on the first line
    head = next(line for line in out.splitlines() if line.startswith("model "))
    assert head.split()[-1] == "verdict" and max(map(len, out.splitlines())) <= 120


def test_fail_above_ignores_faster_phases(capsys):
    code, _, _ = _run(["compare", TWICE, BASE, "--ignore", "model", "--fail-above", "0"], capsys)
    assert code == 0


def test_by_on_one_file(capsys):
    code, out, _ = _run(["compare", BASE, "--by", "precision", "fp32", "bf16-mixed",
                         "--format", "markdown"], capsys)
    assert code == 0
    assert "NEW precision=bf16-mixed vs BASE precision=fp32" in out and "|" in out


def test_json_on_stdout_is_only_json(capsys):
    code, out, err = _run(["compare", BASE, TWICE, "--ignore", "model", "--json"], capsys)
    assert code == 0
    rows = json.loads(out)
    assert {r["table"] for r in rows} >= {"phases", "throughput and memory"}


def test_csv_is_the_numeric_frame(capsys):
    code, out, _ = _run(["compare", BASE, AGAIN, "--format", "csv"], capsys)
    assert code == 0
    header = out.splitlines()[0].split(",")
    wanted = {"base_median_ms", "new_median_ms", "ratio", "ci_low", "ci_high", "verdict"}
    assert wanted <= set(header)


@pytest.mark.parametrize("argv, fragment", [
    (["compare", BASE], "give two results files"),
    (["compare", BASE, AGAIN, TWICE], "got 3 files"),
    (["compare", "no/such.jsonl", AGAIN], "does not exist"),
    (["compare", BASE, "--by", "precision", "fp32", "fp64"], "values there: bf16-mixed, fp32"),
    (["compare", BASE, AGAIN, "--fail-above", "-5"], "--fail-above must be"),
    (["compare", BASE, AGAIN, "--confidence", "2"], "--confidence must be"),
    (["compare", BASE, AGAIN, "--by", "precision", "fp32"], "--by takes FIELD, or FIELD A B"),
    (["compare", BASE, "--by", "size"], "--by size: needs exactly two values of size"),
])
def test_bad_input_is_one_line_and_exit_2(argv, fragment, capsys):
    code, out, err = _run(argv, capsys)
    assert code == 2
    assert fragment in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_inconclusive_phases_do_not_trip_fail_above(capsys, tmp_path):
    rows = [json.loads(line) for line in Path(TWICE).read_text().splitlines()]
    for r in rows:
        r["env"].update(load_average_1m=8.0, cpu_count=2, device="cpu")
    loaded = tmp_path / "loaded.jsonl"
    loaded.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["compare", BASE, str(loaded), "--ignore", "model", "--fail-above", "20"]
    code, out, err = _run(argv, capsys)
    assert code == 0 and "8 phase(s) inconclusive" in err
    code, _, _ = _run(argv + ["--max-load", "inf"], capsys)
    assert code == 1


def test_fail_above_names_the_slower_phases(capsys):
    code, _, err = _run(["compare", BASE, TWICE, "--ignore", "model", "--fail-above", "20"], capsys)
    assert code == 1
    assert "slower: forward of precision=fp32: +" in err
