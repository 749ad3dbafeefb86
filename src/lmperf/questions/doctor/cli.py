"""`lmperf doctor`: the flags (from the shared vocabulary) -> `lmperf.questions.doctor.api.doctor` -> the
table, the record appended to results/doctor.jsonl, and exit code 1 when a check failed."""

from __future__ import annotations

import argparse
from pathlib import Path

from lmperf.core.command import emit, err
from lmperf.core.vocabulary import add_options
from lmperf.questions.doctor.api import TIMEOUT_S

DEFAULT_OUT = Path("results") / "doctor.jsonl"


HELP = "check, for real, each path lmperf relies on here (run it first on a new machine)"
# `lmperf doctor --help` (one paragraph; line breaks here are not kept)
DESCRIPTION = " ".join("""
Run brief real checks of what lmperf relies on for this device (clocks, memory probes, the
memory cap, autocast, the GradScaler, profiling, attention kernels, the peak table) and
print one row per check: ok, fail or skip, with why. Each check runs as a job of its own (a
hung one is a failed row after --timeout seconds); a 'doctor' record per check is appended to
--out (attach them to a bug report), and --resume reruns only the checks not ok there. Exits 1
when a check fails.
""".split())


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `lmperf doctor`."""
    p = sub.add_parser("doctor", help=HELP, description=DESCRIPTION)
    add_options(p, ("device", "out", "format", "inline", "timeout", "resume"),
                defaults={"out": DEFAULT_OUT},
                helps={"device": "auto: the CPU's checks, and CUDA's when a GPU is present",
                       "timeout": f"kill a check's job after S seconds (a failed row; default "
                                  f"{TIMEOUT_S:g})"})
    p.add_argument("--check", nargs="+", metavar="NAME", default=None,
                   help="run only these checks (by their name in the table; default: all)")
    p.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    """`lmperf doctor`: run the checks, print the table; 0 when none failed, else 1 (130
    after Ctrl-C, the finished checks' records kept)."""
    from lmperf.core.sweep import SweepInterrupted
    from lmperf.questions.doctor.api import doctor
    from lmperf.questions.doctor.report import counts

    try:
        report = doctor(args.device, checks=args.check, out=args.out, inline=args.inline,
                        timeout=args.timeout, resume=args.resume, progress=args.json != "-")
    except SweepInterrupted as stop:
        err(f"interrupted: {len(stop.records)} check record(s) are saved in {args.out}; run "
            "the same command with --resume to finish the rest")
        return 130
    emit(report, args)
    n = counts(report.frame)
    if args.json != "-":  # with --resume the rows of checks done before are in the counts
        err(f"doctor: {n['ok']} ok, {n['fail']} failed, {n['skip']} skipped; records in "
            f"{args.out}")
    return 1 if n["fail"] else 0
