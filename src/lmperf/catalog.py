"""Every question lmperf answers, in one table: its command, record kind and the functions behind it.

Adding a question is one `Question` here plus its package under `lmperf/questions/`. The
functions are named by "package.module:function" strings (imported where they are used), so
that `lmperf --help`, the core and `lmperf table` reach every question without importing torch
or the question's package, and the core never imports a question (no import cycle);
`tests/test_catalog.py` resolves every string of this table and of every job spec.

This module imports nothing of lmperf's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Question:
    """One question: the `lmperf COMMAND` subcommand and the `lmperf.COMMAND(...)` API function.

    command: the CLI subcommand and the name of the API function.
    package: the question's package (its `cli` module registers the subcommand).
    ask: the question in words (the write-up's section heading, `lmperf --help`).
    api: "module:function" of the API function (real signature and docstring).
    kind: the kind of record it writes, or None (compare and report write none of their own).
    report: "module:function" records -> Report, for `lmperf table` and the write-up.
    summary: "module:function" record -> one progress line, or None (status and message).
    more_kinds: further (kind, "module:function" records -> Report) pairs the question writes
        (bench's predictions are records of kind "prediction").
    """

    command: str
    package: str
    ask: str
    api: str
    kind: str | None = None
    report: str | None = None
    summary: str | None = None
    more_kinds: tuple[tuple[str, str], ...] = ()

    @property
    def cli(self) -> str:
        """The module whose `add_parser(subparsers)` registers the subcommand."""
        return f"{self.package}.cli"


_Q = "lmperf.questions"

QUESTIONS: tuple[Question, ...] = (
    Question("bench", f"{_Q}.bench", "How long do forward, backward and the optimizer step take?",
             f"{_Q}.bench.api:bench", "bench", f"{_Q}.bench.report:build_report",
             f"{_Q}.bench.report:summary_line",
             (("prediction", f"{_Q}.bench.predict:build_report"),)),
    Question("profile", f"{_Q}.profile", "Where does the time go, per phase and operator?",
             f"{_Q}.profile.api:profile", "profile", f"{_Q}.profile.report:build_report"),
    Question("memory", f"{_Q}.memory", "Where does the memory go?",
             f"{_Q}.memory.api:memory", "memory", f"{_Q}.memory.report:build_report",
             f"{_Q}.memory.report:summary_line"),
    Question("train", f"{_Q}.train", "How do precision regimes train, and how fast?",
             f"{_Q}.train.api:train", "train", f"{_Q}.train.report:build_report",
             f"{_Q}.train.report:summary_line"),
    Question("attention", f"{_Q}.attention", "What does attention cost?",
             f"{_Q}.attention.api:attention", "attention", f"{_Q}.attention.report:build_report",
             f"{_Q}.attention.report:summary_line"),
    Question("amp", f"{_Q}.amp", "What does precision do?",
             f"{_Q}.amp.api:amp", "amp", f"{_Q}.amp.report:build_report"),
    Question("compare", f"{_Q}.compare", "Is it faster, really?", f"{_Q}.compare.api:compare"),
    Question("report", f"{_Q}.writeup", "All results on one page", f"{_Q}.writeup.api:report"),
    Question("doctor", f"{_Q}.doctor", "Does lmperf work on this machine?",
             f"{_Q}.doctor.api:doctor", "doctor", f"{_Q}.doctor.report:build_report",
             f"{_Q}.doctor.records:summary_line"),
    Question("dist", f"{_Q}.parallel", "What does data parallelism cost?",
             f"{_Q}.parallel.api:dist", "dist", f"{_Q}.parallel.report:build_report",
             f"{_Q}.parallel.report:summary_line"),
    Question("plan", f"{_Q}.plan", "What should I run, will it fit, how fast will it be?",
             f"{_Q}.plan.api:plan", "plan", f"{_Q}.plan.report:build_report"),
)

BY_COMMAND: dict[str, Question] = {q.command: q for q in QUESTIONS}
BY_KIND: dict[str, Question] = {**{q.kind: q for q in QUESTIONS if q.kind},
                                 **{k: q for q in QUESTIONS for k, _ in q.more_kinds}}
# record kind -> "module:function"(records) -> Report
REPORTS: dict[str, str] = {**{q.kind: q.report for q in QUESTIONS if q.kind and q.report},
                           **{k: r for q in QUESTIONS for k, r in q.more_kinds}}

# What the warm fork server (`lmperf.core.forkserver`) imports and runs once before forking jobs
# (on the critical path of every command's first job: no pandas, which bench's jobs never use).
PRELOAD: tuple[str, ...] = ("torch", "numpy", "lmperf.core.child",
                            "lmperf.questions.bench.job")
# Imported by the server, once, before it forks the first job of a kind (beside the job's runner
# module): what each child of that kind would otherwise import itself.
PRELOAD_FOR_KIND: dict[str, tuple[str, ...]] = {"amp": ("pandas",)}
WARM_UP: str = "lmperf.workload.build:warm_up"
