"""`python -m lmperf`: the same entry point as the `lmperf` console script; under a user's own
torchrun, `-m lmperf dist comm|train ...` makes this process one rank of `lmperf dist`."""

import sys

from lmperf.cli import run


def _entry(argv: list[str]) -> int:
    if argv[:1] == ["dist"]:
        from lmperf.questions.parallel.__main__ import run_rank, under_torchrun

        if under_torchrun():
            return run_rank(argv[1:])  # a rank ends as torchrun expects (full teardown)
    run(argv)  # the command: ends the process without the interpreter's teardown


raise SystemExit(_entry(sys.argv[1:]))
