"""One module layout for every question package (docs/architecture.md, "One layout per question"):
api.py and cli.py for all; spec.py, job.py and report.py for a question that writes records."""

from __future__ import annotations

import importlib.util

import pytest

from lmperf.catalog import QUESTIONS

EVERY = ("api", "cli")
WRITES_RECORDS = ("spec", "job", "report")
# (command, role) -> the module that plays it instead, and why
ELSEWHERE = {
    ("bench", "spec"): "lmperf.workload.spec",  # RunSpec: the run every timing question shares
    ("dist", "job"): "lmperf.core.torchrun",  # torchrun; the rank side is lmperf.core.rank
}


@pytest.mark.parametrize("q", QUESTIONS, ids=[q.command for q in QUESTIONS])
def test_each_question_package_has_the_layouts_modules(q):
    roles = EVERY + (WRITES_RECORDS if q.kind else ())
    for role in roles:
        module = ELSEWHERE.get((q.command, role), f"{q.package}.{role}")
        assert importlib.util.find_spec(module) is not None, f"{q.command}: no {module}"
    if q.kind:
        assert q.report == f"{q.package}.report:build_report", q.report


def test_the_exceptions_are_still_exceptions():
    for (command, role), module in ELSEWHERE.items():
        package = next(q.package for q in QUESTIONS if q.command == command)
        assert importlib.util.find_spec(f"{package}.{role}") is None, (
            f"{package}.{role} exists now: drop it from ELSEWHERE")
        assert importlib.util.find_spec(module) is not None
