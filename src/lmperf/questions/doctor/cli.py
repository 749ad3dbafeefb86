"""`lmperf doctor`: the flags (from the shared vocabulary) -> `lmperf.questions.doctor.api.doctor` -> the
table, the record appended to results/doctor.jsonl, and exit code 1 when a check failed."""

from __future__ import annotations

import argparse
from pathlib import Path

from lmperf.core.command import emit, err
from lmperf.core.vocabulary import add_options

DEFAULT_OUT = Path("results") / "doctor.jsonl"


HELP = "check, for real, each path lmperf relies on here (run it first on a new machine)"
# `lmperf doctor --help` (one paragraph; line breaks here are not kept)
DESCRIPTION = " ".join("""
Run brief real checks of what lmperf relies on for this device (clocks, memory probes, the
memory cap, autocast, the GradScaler, profiling, attention kernels, nsys, the peak table) and
print one row per check: ok, fail or skip, with why. Appends a 'doctor' record (attach it to a
bug report); exits 1 when a check fails.
""".split())


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `lmperf doctor`."""
    p = sub.add_parser("doctor", help=HELP, description=DESCRIPTION)
    add_options(p, ("device", "out", "format"), defaults={"out": DEFAULT_OUT},
                helps={"device": "auto: the CPU's checks, and CUDA's when a GPU is present"})
    p.add_argument("--check", nargs="+", metavar="NAME", default=None,
                   help="run only these checks (by their name in the table; default: all)")
    p.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    """`lmperf doctor`: run the checks, print the table; 0 when none failed, else 1."""
    from lmperf.questions.doctor.api import doctor

    report = doctor(args.device, checks=args.check, out=args.out, progress=args.json != "-")
    emit(report, args)
    counts = report.records[0]["metrics"]["counts"]
    if args.json != "-":
        err(f"doctor: {counts['ok']} ok, {counts['fail']} failed, {counts['skip']} skipped; "
            f"record appended to {args.out}")
    return 1 if counts["fail"] else 0
