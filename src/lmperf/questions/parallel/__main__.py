"""`python -m lmperf dist ...`: the `lmperf dist` command line, or, under a user's own torchrun
(many nodes: docs/commands/dist.md), a rank: every rank plans the same jobs from the same flags
and runs those of torchrun's WORLD_SIZE; rank 0 appends the records to --out and prints the
tables. A rank that fails exits non-zero and torchrun reports it.
"""

from __future__ import annotations

import os
import sys


def under_torchrun() -> bool:
    """Whether this process is a rank that torchrun started for a user (not for lmperf's launcher)."""
    from lmperf.core.rank import ENV_DIR

    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and not os.environ.get(ENV_DIR)


def run_rank(argv: list[str]) -> int:
    """Plan from `argv` (lmperf dist's flags), run the jobs of this world size on this rank."""
    from lmperf.cli import build_parser
    from lmperf.core.command import emit
    from lmperf.core.sweep import pending_specs
    from lmperf.questions.parallel.cli import run_kwargs
    from lmperf.questions.parallel.plan import plan_dist
    from lmperf.questions.parallel.report import build_report
    from lmperf.core.rank import run_items, setup, shutdown
    from lmperf.results import store

    args = build_parser("dist").parse_args(["dist", *argv])
    if args.estimate or args.what not in ("comm", "train"):
        raise SystemExit("under torchrun, name the command: `-m lmperf dist comm ...` or "
                         "`-m lmperf dist train ...`")
    # the same plan lmperf dist makes from the same flags, at torchrun's world size
    plan = plan_dist(args.what, world_size=int(os.environ["WORLD_SIZE"]), timeout=args.timeout,
                     max_memory_gib=args.max_memory_gib, **run_kwargs(args))
    jobs = pending_specs(plan.jobs, args.out, args.resume)  # --resume: the items left
    records: list[dict] = []

    def sink(record: dict) -> None:
        from lmperf.results.schema import to_jsonable

        record = to_jsonable(record)
        if args.out is not None:
            store.ensure_writable(args.out)
            store.append_record(args.out, record)
        records.append(record)

    for job in jobs:
        ctx = setup(job, None)
        run_items(job, job.items(), ctx, sink)
        shutdown(ctx)
    if int(os.environ["RANK"]) == 0:
        emit(build_report(records), args)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m lmperf dist`."""
    argv = sys.argv[1:] if argv is None else argv
    if under_torchrun():
        return run_rank(argv)
    from lmperf.cli import main as cli_main

    return cli_main(["dist", *argv])


if __name__ == "__main__":
    sys.exit(main())
