"""`lmperf profile` and `lmperf.profile(...)` on the core: a job in a child process (OOM is a row),
records, traces, CSV, --json, `lmperf table` of profile records, bad input."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout

import pandas as pd
import pytest

import lmperf
from lmperf.cli import main
from tests.conftest import CPU_CAP_GIB

QUICK = ["--size", "tiny", "--context", "32", "--batch", "2", "--steps", "2", "--warmup", "1"]


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def forward_run(tmp_path_factory) -> dict:
    """One inline forward-mode profile through the CLI, with a trace and CSV tables."""
    tmp = tmp_path_factory.mktemp("cli")
    paths = {"out": tmp / "p.jsonl", "trace": tmp / "t.json", "csv": tmp / "csv"}
    code, out, err = _run(["profile", *QUICK, "--mode", "forward", "--inline",
                           "--out", str(paths["out"]), "--trace", str(paths["trace"]),
                           "--csv", str(paths["csv"]), "--format", "markdown"])
    assert code == 0, err
    return {**paths, "stdout": out, "stderr": err}


def test_cli_writes_record_trace_and_csv(forward_run):
    (record,) = [json.loads(x) for x in forward_run["out"].read_text().splitlines()]
    assert record["kind"] == "profile" and record["status"] == "ok"
    spec = record["spec"]
    assert spec["mode"] == "forward" and spec["warmup"] == 1 and "backend" not in spec
    assert spec["threads"] == 1  # the CPU thread policy, recorded
    assert "top" not in spec and "trace" not in spec  # the record's spec: the run's
    assert record["params"] > 0
    assert record["metrics"]["trace_path"] == str(forward_run["trace"])
    assert forward_run["trace"].exists()
    assert "#### top operators (self time): forward" in forward_run["stdout"]
    assert "backward" not in " ".join(record["metrics"]["tables"])  # forward mode: no backward
    csvs = sorted(forward_run["csv"].iterdir())
    assert len(csvs) == len(record["metrics"]["tables"])
    assert all(not pd.read_csv(p).empty for p in csvs)
    assert "1 profile(s): 1 ok" in forward_run["stderr"]


def test_oom_is_a_row_with_exit_0_and_no_traceback(tmp_path):
    """small at 512 tokens (batch 4) cannot even be built in a 1.5 GiB address space."""
    out = tmp_path / "p.jsonl"
    code, stdout, err = _run(["profile", "--size", "small", "--context", "512",
                              "--max-memory-gib", str(CPU_CAP_GIB), "--out", str(out),
                              "--trace", str(tmp_path / "t.json")])
    assert code == 0, err
    assert "Traceback" not in err and "Traceback" not in stdout
    (record,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert record["status"] == "oom" and "out of memory while" in record["message"]
    assert record["spec"]["size"] == "small"
    assert "RLIMIT_AS" in record["memory_cap"]
    assert "oom [1]" in stdout and "1 profile(s): 1 oom" in err


def test_timeout_is_an_error_row(tmp_path):
    out = tmp_path / "p.jsonl"
    code, _, err = _run(["profile", *QUICK, "--timeout", "0.2", "--out", str(out),
                         "--trace", str(tmp_path / "t.json")])
    assert code == 0, err
    (record,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert record["status"] == "error" and "timed out after 0.2 s" in record["message"]


def test_bare_json_prints_only_the_records(tmp_path):
    code, stdout, err = _run(["profile", *QUICK, "--mode", "forward", "--inline", "--json",
                              "--out", str(tmp_path / "p.jsonl"),
                              "--trace", str(tmp_path / "t.json")])
    assert code == 0, err
    (record,) = json.loads(stdout)
    assert record["kind"] == "profile" and record["status"] == "ok"


@pytest.mark.parametrize("fmt", ["latex", "csv", "markdown"])
def test_table_renders_profile_records(forward_run, fmt, tmp_path):
    # the forward run plus a failed row, as `lmperf table` finds them in a results file
    results = tmp_path / "profile.jsonl"
    lines = forward_run["out"].read_text().splitlines()
    failed = {**json.loads(lines[0]), "status": "oom", "message": "out of memory while x",
              "metrics": None, "params": None}
    results.write_text("\n".join([lines[0], json.dumps(failed)]) + "\n")
    code, stdout, err = _run(["table", str(results), "--format", fmt])
    assert code == 0, err
    if fmt == "csv":
        df = pd.read_csv(io.StringIO(stdout))
        assert list(df["status"]) == ["ok", "oom"]
        assert df["forward_ms_mean"].iloc[0] > 0 and pd.isna(df["forward_ms_mean"].iloc[1])
    elif fmt == "latex":
        assert stdout.count(r"\begin{tabular}") >= 3 and "top operators" in stdout
        assert "oom [1]" in stdout
    else:
        assert "#### " in stdout and "size tiny" in stdout and "oom [1]" in stdout


def test_api_returns_a_report_with_one_row(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default trace goes to results/traces here
    report = lmperf.profile(size="tiny", context=32, mode="forward", steps=2, warmup=0,
                            inline=True)
    assert isinstance(report.frame, pd.DataFrame) and len(report.frame) == 1
    row = report.frame.iloc[0]
    assert row["status"] == "ok" and row["warmup"] == 0 and row["forward_ms_mean"] > 0
    assert "top operators (self time): forward" in report.tables
    assert any(f.startswith("(a) forward") for f in report.findings)
    assert not (tmp_path / "results" / "profile.jsonl").exists()  # out=None: in memory
    assert list((tmp_path / "results" / "traces").glob("*.json"))


@pytest.mark.parametrize("argv, fragment", [
    (["profile", "--top", "0"], "--top must be a positive integer"),
    (["profile", "--size", "huge"], "unknown size 'huge'"),
    (["profile", "--precision", "tf33"], "--precision: unknown regime 'tf33'"),
    (["profile", "--mode", "inference"], "unknown mode 'inference'"),
    (["profile", "--warmup", "-1"], "--warmup must be a non-negative integer, got -1"),
    (["profile", "--timeout", "0"], "--timeout must be a positive number"),
    (["profile", "--model", "tests.fixtures.models:nope"], "has no callable 'nope'"),
])
def test_bad_input_is_one_line(argv, fragment, tmp_path):
    out = tmp_path / "p.jsonl"
    code, _, err = _run(argv + ["--out", str(out)])
    assert code == 2
    assert fragment in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()  # nothing ran


def test_compile_profiles_the_compiled_model_with_compile_time_apart(tmp_path):
    import lmperf

    report = lmperf.profile(size="tiny", context=16, mode="forward", steps=2, warmup=0,
                            compile=True, inline=True, trace=tmp_path / "t.json")
    (record,) = report.records
    assert record["status"] == "ok" and record["spec"]["compile"] is True
    assert record["metrics"]["timings_s"]["compile_s"] > 0
