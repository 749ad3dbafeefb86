"""`lmperf doctor` from the command line: the whole doctor once (as a user runs it), then the
exit codes, --check, --json and the record, on a few quick checks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import lmperf
import lmperf.questions.doctor
from lmperf.cli import main
from lmperf.questions.doctor import registry
from lmperf.questions.doctor.checks import Check, fail, ok
from lmperf.results.store import read_records

QUICK = ["--check", "peak table entry", "GradScaler disabled path"]


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """`python -m lmperf doctor` on this machine, once: (exit code, stdout, stderr, records)."""
    out = tmp_path_factory.mktemp("doctor") / "doctor.jsonl"
    proc = subprocess.run([sys.executable, "-m", "lmperf", "doctor", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr, read_records(out), out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU machine's acceptance")
def test_the_whole_doctor_on_this_cpu(full_run):
    code, stdout, stderr, records, _ = full_run
    assert code == 0, stdout + stderr
    assert "Traceback" not in stderr
    # One record per check, appended as each job ended (so in the order they finished).
    assert all(r["kind"] == "doctor" and r["status"] in ("ok", "unsupported") for r in records)
    rows = [r["metrics"] for r in records]
    assert sorted(r["check"] for r in rows) == sorted(registry.NAMES)
    ran = [n for n in registry.NAMES if n in {r["check"] for r in rows if r["device"] != "cuda"}]
    assert stdout.index(ran[0]) < stdout.index(ran[-1])  # table order
    by_scope = {s: [r for r in rows if r["device"] == s] for s in ("any", "cpu", "cuda")}
    # Every CPU check ran (ok), except where this machine lacks the tool, which must say so.
    for row in by_scope["cpu"] + by_scope["any"]:
        assert row["status"] in ("ok", "skip"), row
        if row["status"] == "skip":
            assert row["check"] == "flash-triton vs SDPA (interpreter)", row
            assert row["why"]
    assert all(r["status"] == "ok" for r in by_scope["cpu"]
               if r["check"] != "flash-triton vs SDPA (interpreter)")
    # Every CUDA check is listed, skipped, with the reason.
    assert len(by_scope["cuda"]) >= 12
    assert all(r["status"] == "skip" and r["why"].startswith("no CUDA device") for r in by_scope["cuda"])
    for name in ran:
        assert name in stdout
    # The skipped CUDA checks are one row, their reason one note (issue 28): under 25 lines.
    assert f"{len(by_scope['cuda'])} CUDA checks" in stdout and stdout.count("no CUDA device") == 1
    assert len(stdout.splitlines()) < 25 and max(map(len, stdout.splitlines())) <= 120
    assert "doctor: " in stderr


def test_the_record_renders_in_lmperf_table(full_run, capsys):
    *_, out = full_run
    assert main(["table", str(out), "--format", "markdown"]) == 0
    text = capsys.readouterr().out
    assert "| check" in text and "memory cap -> oom row (cpu)" in text and "ok" in text


def _run(argv, capsys):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_quick_checks_and_the_record(tmp_path, capsys):
    out = tmp_path / "d.jsonl"
    code, stdout, stderr = _run(["doctor", "--out", str(out), *QUICK], capsys)
    assert code == 0, stderr
    assert "peak table entry" in stdout and "GradScaler disabled path" in stdout
    assert "2 ok, 0 failed, 0 skipped; records in" in " ".join(stderr.split())
    records = {r["spec"]["check"]: r for r in read_records(out)}  # in the order jobs ended
    assert sorted(records) == sorted(QUICK[1:])  # one record each
    assert records["peak table entry"]["spec"] == {"check": "peak table entry", "scope": "any",
                                                   "device": "cpu", "threads": 1}
    assert records["peak table entry"]["env"]["torch"] == torch.__version__
    code, _, _ = _run(["doctor", "--out", str(out), *QUICK], capsys)
    assert code == 0 and len(read_records(out)) == 4  # appended, never overwritten
    code, stdout, stderr = _run(["doctor", "--out", str(out), "--resume", *QUICK], capsys)
    assert code == 0 and len(read_records(out)) == 4  # both already ok: nothing ran
    assert "resume: 2 job(s) already ok in the results file, 0 to go" in stderr
    assert "doctor: 2 ok, 0 failed, 0 skipped" in stderr  # the whole run, as before


def test_a_failed_check_exits_1_and_marks_the_record(tmp_path, capsys, monkeypatch):
    checks = (Check("fine", "cpu", lambda c: ok("measured")),
              Check("broken", "cpu", lambda c: fail("saw 3", "expected 4")))
    monkeypatch.setattr(registry, "CHECKS", checks)
    monkeypatch.setattr(registry, "NAMES", ("fine", "broken"))
    out = tmp_path / "d.jsonl"
    # --inline: the stand-in checks exist in this process only, not in a forked child
    code, stdout, stderr = _run(["doctor", "--out", str(out), "--inline"], capsys)
    assert code == 1
    assert "1 ok, 1 failed, 0 skipped" in stderr
    fine, broken = read_records(out)
    assert fine["status"] == "ok" and broken["status"] == "error"
    assert broken["message"] == "saw 3: expected 4" and broken["metrics"]["status"] == "fail"


def test_json_on_stdout_is_only_json(tmp_path, capsys):
    code, stdout, stderr = _run(["doctor", "--out", str(tmp_path / "d.jsonl"), "--json", *QUICK],
                                capsys)
    assert code == 0
    records = json.loads(stdout)
    assert [r["kind"] for r in records] == ["doctor", "doctor"]


@pytest.mark.parametrize("argv, fragment", [
    (["doctor", "--check", "no such check"], "unknown check(s) 'no such check'; checks: versions"),
    (["doctor", "--device", "gpu"], "invalid choice: 'gpu'"),
] + ([] if torch.cuda.is_available() else
     [(["doctor", "--device", "cuda"], "--device cuda was asked for, but torch sees no CUDA")]))
def test_bad_input_is_one_line_and_exit_2(argv, fragment, capsys, tmp_path):
    with pytest.raises(SystemExit) if "gpu" in argv else _nothing():
        code, _, stderr = _run(argv + ["--out", str(tmp_path / "d.jsonl")], capsys)
        assert code == 2
        assert fragment in stderr and len(stderr.strip().splitlines()) == 1
    if "gpu" in argv:
        assert fragment in capsys.readouterr().err


def test_the_api_returns_a_report():
    report = lmperf.doctor(checks="peak table entry")
    assert report.kind == "doctor" and list(report.frame["check"]) == ["peak table entry"]
    assert report.frame["status"].tolist() == ["ok"] and report.records[0]["status"] == "ok"
    assert report.headline == ["1 ok, 0 failed, 0 skipped."]
    assert report.render("text").startswith("1 ok, 0 failed, 0 skipped.\n")  # the first line


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
def test_the_cuda_checks_pass_on_this_gpu(tmp_path):
    report = lmperf.doctor("cuda", out=tmp_path / "d.jsonl")
    rows = report.frame.to_dict("records")
    failed = [(r["check"], r["result"], r["why"]) for r in rows if r["status"] == "fail"]
    assert not failed
    cuda = [r for r in rows if r["device"] == "cuda"]
    assert all(r["status"] == "ok" for r in cuda
               if r["check"] not in ("flash-triton vs SDPA (compiled)",))
