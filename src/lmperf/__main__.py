"""`python -m lmperf`: the same entry point as the `lmperf` console script; under a user's own
torchrun, `-m lmperf dist comm|train ...` makes this process one rank of `lmperf dist`."""

import sys

from lmperf.cli import main


def _entry(argv: list[str]) -> int:
    if argv[:1] == ["dist"]:
        from lmperf.questions.parallel.__main__ import run_rank, under_torchrun

        if under_torchrun():
            return run_rank(argv[1:])
    return main(argv)


raise SystemExit(_entry(sys.argv[1:]))
