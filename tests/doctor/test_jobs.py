"""The doctor's checks as jobs: how they are planned (one per check, a shared launch once),
their records (one per check, read back into rows), --resume, and a hung check's timeout."""

from __future__ import annotations

import json
import math

import pytest

import lmperf
from lmperf.questions.doctor import api, registry
from lmperf.questions.doctor.checks import Check, fail, ok
from lmperf.questions.doctor.job import run_job
from lmperf.questions.doctor.spec import CheckJob
from lmperf.questions.doctor.records import latest_rows, rows_of
from lmperf.questions.doctor.report import build_report
from lmperf.results.store import read_records

GLOO = ("collectives vs reference (gloo, 2 ranks)", "1 step per strategy = 1 process (gloo)")


def test_every_check_is_in_one_job_and_the_torchrun_pair_is_one_job_started_first():
    jobs = api.plan_jobs(api.plan_scopes("auto"), registry.NAMES)
    names = [name for job in jobs for name in job.checks]
    assert sorted(names) == sorted(registry.NAMES)
    assert jobs[0].checks == GLOO and jobs[0].device == "cpu"
    launching = [j.checks[0] for j in jobs[:3]]
    assert launching[1:] == ["flash-triton vs SDPA (interpreter)", "memory cap -> oom row (cpu)"]
    # CUDA's checks cannot run here: one job each, never grouped (their rows are made unrun)
    cuda = [j for j in jobs if j.scope == "cuda"]
    assert cuda and all(len(j.checks) == 1 and j.device == "cuda" for j in cuda)


def test_the_job_round_trips_and_names_one_spec_per_check():
    job = CheckJob(GLOO, "cpu")
    assert CheckJob.from_dict(json.loads(json.dumps(job.to_dict()))) == job
    assert job.item_spec(GLOO[1]) == {"check": GLOO[1], "scope": "cpu", "device": "cpu",
                                      "threads": 1}
    assert job.with_items([GLOO[1]]).checks == (GLOO[1],)


@pytest.fixture
def stand_ins(monkeypatch):
    """Three stand-in checks in the registry ('a' and 'b' share a launch); `calls` counts runs.
    Used inline: a forked child would see the real registry."""
    calls: list[str] = []

    def launch(ctx):
        calls.append("launch")
        return lambda: 7

    def check(name, passes):
        def run(ctx):
            calls.append(name)
            answer = ctx.result_of(launch)
            return ok(f"answer {answer}") if passes() else fail(f"answer {answer}", "expected 8")
        return run

    broken = {"b": True}
    checks = (Check("a", "cpu", check("a", lambda: True), "x"),
              Check("b", "cpu", check("b", lambda: not broken["b"]), "x"),
              Check("c", "cpu", check("c", lambda: True)))
    monkeypatch.setattr(registry, "CHECKS", checks)
    monkeypatch.setattr(registry, "NAMES", tuple(c.name for c in checks))
    return calls, broken


def test_checks_sharing_a_launch_are_one_job_and_launch_once(stand_ins):
    calls, _ = stand_ins
    jobs = api.plan_jobs(api.plan_scopes("cpu"), ["a", "b", "c"])
    assert [j.checks for j in jobs] == [("a", "b"), ("c",)]
    records = run_job(jobs[0])
    assert calls == ["a", "launch", "b"]
    assert [r["spec"]["check"] for r in records] == ["a", "b"]
    assert [r["status"] for r in records] == ["ok", "error"]
    assert records[1]["message"] == "answer 7: expected 8"
    assert [row["status"] for r in records for row in rows_of(r)] == ["ok", "fail"]


def test_resume_reruns_only_the_checks_not_ok_even_inside_a_shared_job(tmp_path, stand_ins):
    calls, broken = stand_ins
    out = tmp_path / "d.jsonl"
    first = lmperf.doctor("cpu", out=out, inline=True)
    assert first.frame["status"].tolist() == ["ok", "fail", "ok"]
    calls.clear()
    broken["b"] = False
    again = lmperf.doctor("cpu", out=out, inline=True, resume=True)
    # 'a' (ok) shares b's job: only b runs again, and 'c' (ok) not at all
    assert calls == ["b", "launch"]
    # the whole run comes back (issue 28: --resume prints the whole sweep), b now ok
    assert again.frame["check"].tolist() == ["a", "b", "c"]
    assert again.frame["status"].tolist() == ["ok", "ok", "ok"]
    latest = build_report(read_records(out))
    assert latest.frame["status"].tolist() == ["ok", "ok", "ok"]
    assert "1 earlier row(s)" in latest.findings[-1]


def test_a_job_that_left_no_record_is_a_failed_row_per_check():
    crashed = {"kind": "doctor", "status": "error", "spec": CheckJob(GLOO, "cpu").to_dict(),
               "message": "timed out after 3 s; the child was killed", "metrics": None}
    rows = rows_of(crashed)
    assert [r["check"] for r in rows] == list(GLOO)
    assert all(r["status"] == "fail" and r["result"].startswith("timed out after 3 s")
               and math.isnan(r["seconds"]) for r in rows)


def test_records_of_the_whole_run_layout_are_read():
    # before the checks were jobs (schema 1): one record per run, every row in metrics.checks;
    # the migration makes it one record per check
    from lmperf.results.record import migrate

    old = {"schema": 1, "kind": "doctor", "status": "error",
           "spec": {"device": "auto", "checks": "all"},
           "metrics": {"checks": [
               {"check": "a", "device": "cpu", "status": "ok", "result": "r", "why": "w",
                "seconds": 1.0, "values": {}},
               {"check": "b", "device": "cpu", "status": "fail", "result": "r", "why": "w",
                "seconds": 2.0, "values": {}}]}}
    newer_b = {**old, "status": "ok", "spec": {"check": "b", "scope": "cpu"},
               "metrics": {**old["metrics"]["checks"][1], "status": "ok"}}
    assert [r["status"] for r in migrate([old])] == ["ok", "error"]
    assert [r["status"] for r in latest_rows(migrate([old]))] == ["ok", "fail"]
    assert [r["status"] for r in latest_rows(migrate([old, newer_b]))] == ["ok", "ok"]


@pytest.mark.slow
def test_a_hung_check_is_a_failed_row_and_the_others_still_run(tmp_path, monkeypatch):
    # The gloo collectives take 10-30 s (torchrun and 2 ranks importing torch): past a 3 s
    # per-check timeout their whole process tree is killed; the other check's job runs.
    out = tmp_path / "d.jsonl"
    slow = "collectives vs reference (gloo, 2 ranks)"
    report = lmperf.doctor("cpu", checks=[slow, "peak table entry"], out=out, timeout=3)
    rows = report.frame.set_index("check")
    assert rows.loc["peak table entry", "status"] == "ok"
    assert rows.loc[slow, "status"] == "fail"
    assert rows.loc[slow, "result"].startswith("timed out after 3 s")
    assert {r["status"] for r in read_records(out)} == {"ok", "error"}


def test_resume_does_not_append_a_skipped_check_again(tmp_path):
    out = tmp_path / "d.jsonl"
    names = ["versions and env capture", "CUDA device"]  # any device; CUDA's: skipped with --device cpu
    first = lmperf.doctor("cpu", checks=names, out=out, inline=True)
    assert first.frame["status"].tolist() == ["ok", "skip"]
    lines = out.read_text().splitlines()
    lmperf.doctor("cpu", checks=names, out=out, inline=True, resume=True)
    assert out.read_text().splitlines() == lines
