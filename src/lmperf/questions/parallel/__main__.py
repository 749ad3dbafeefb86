"""`python -m lmperf dist ...`: the `lmperf dist` command line, or, under torchrun, a rank.

Started by a user's own torchrun (many nodes: `torchrun --nnodes N --nproc-per-node G
--rdzv-backend c10d --rdzv-endpoint HOST:PORT -m lmperf dist train ...`, or under SLURM
`srun ... torchrun ...`), every rank plans the same jobs from the same arguments, keeps the one
whose world size is torchrun's WORLD_SIZE, and runs its items; rank 0 appends the records to
--out (the same records `lmperf dist` writes) and prints the tables. A rank that fails exits
non-zero and torchrun reports it. Outside torchrun this is `lmperf dist ...`.
"""

from __future__ import annotations

import os
import sys


def under_torchrun() -> bool:
    """Whether this process is a rank that torchrun started for a user (not for lmperf's launcher)."""
    from lmperf.questions.parallel.worker import ENV_DIR

    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and not os.environ.get(ENV_DIR)


def run_rank(argv: list[str]) -> int:
    """Plan from `argv` (lmperf dist's flags), run the jobs of this world size on this rank."""
    from lmperf.cli import build_parser
    from lmperf.core.command import emit
    from lmperf.questions.parallel.plan import drop_done, plan_dist
    from lmperf.questions.parallel.report import build_report
    from lmperf.questions.parallel.worker import run_items, setup, shutdown
    from lmperf.results import store

    args = build_parser().parse_args(["dist", *argv])
    if args.estimate or args.what == "all":
        raise SystemExit("under torchrun, name the command: `-m lmperf dist comm ...` or "
                         "`-m lmperf dist train ...`")
    world = int(os.environ["WORLD_SIZE"])
    plan = plan_dist(args.what, world_size=world, collective=args.collective, sizes=args.sizes,
                     dtype=args.dtype, iters=args.iters, strategy=args.strategy, size=args.size,
                     course=args.course, context=args.context, batch=args.batch,
                     warmup=args.warmup, steps=args.steps, profile_steps=args.profile_steps,
                     lr=args.lr, bucket_mb=args.bucket_mb, compute_dtype=args.compute_dtype,
                     compress=args.compress, seed=args.seed, device=args.device,
                     threads=args.threads, timeout=args.timeout,
                     max_memory_gib=args.max_memory_gib, vocab_size=args.vocab_size)
    jobs = drop_done(plan.jobs, args.out) if args.resume else plan.jobs
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
