"""`lmperf attention`: the course's attention sweeps, one isolated process per configuration."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

DEFAULT_OUT = Path("results") / "attention.jsonl"
FORMATS: tuple[str, ...] = ("text", "markdown", "csv")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `lmperf attention`."""
    from lmperf.kernels import NAMES
    from lmperf.attention.spec import DTYPES, SUITES

    p = sub.add_parser(
        "attention", help="naive vs SDPA vs compiled vs FlashAttention-2: latency and memory vs seq",
        description="Sweep attention implementations over batch x heads x d x seq x dtype, one "
                    "child process per configuration: forward, backward and fwd+bwd latency, the "
                    "memory left for backward next to the analytic score matrix, OOM as a row. "
                    "Suites follow the course and are scaled down on the CPU.")
    p.add_argument("--suite", default="flash", choices=list(SUITES),
                   help="; ".join(f"{s.name}: {s.summary}" for s in SUITES.values())
                        + " (default: flash)")
    p.add_argument("--impl", nargs="+", metavar="IMPL",
                   help=f"implementations: {', '.join(NAMES)} (default: the suite's)")
    p.add_argument("--seq", nargs="+", type=int, metavar="T", help="sequence lengths")
    p.add_argument("--d", nargs="+", type=int, metavar="D", help="head dimensions")
    p.add_argument("--batch", type=int, metavar="B", help="batch size (default: the suite's)")
    p.add_argument("--heads", type=int, metavar="H", help="heads (default: the suite's)")
    p.add_argument("--dtype", nargs="+", metavar="DTYPE", help=f"{', '.join(DTYPES)}")
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=None,
                   help="causal mask (default: the suite's: flash causal, pytorch not)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per pass (default: 2)")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per pass (default: 5)")
    p.add_argument("--threads", type=int, metavar="N",
                   help="torch CPU threads per child (default: 1 on the CPU, where a second thread "
                        "on a shared 2-core machine made timings erratic; torch's default on CUDA)")
    p.add_argument("--seed", type=int, default=0, help="seed of q, k, v, dO (default: 0)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help=f"JSONL results file, appended to (default: {DEFAULT_OUT})")
    p.add_argument("--plots", type=Path, metavar="DIR", help="write the three PNG plots into DIR")
    p.add_argument("--resume", action="store_true", help="skip configurations already 'ok' in --out")
    p.add_argument("--inline", action="store_true", help="run in this process (debugging)")
    p.add_argument("--timeout", type=float, metavar="S", help="kill a configuration after S seconds")
    p.add_argument("--max-memory-gib", type=float, metavar="G",
                   help="cap each child's memory so a too-large configuration is an OOM row "
                        "(CPU: address space incl. ~0.6 GiB for Python+torch; CUDA: allocator)")
    p.add_argument("--format", default="text", choices=list(FORMATS))
    p.set_defaults(func=cmd_attention)


def cmd_attention(args: argparse.Namespace) -> int:
    """Plan, run the sweep, print the tables and findings, write plots; returns the exit code."""
    from rich.console import Console

    from lmperf.attention.progress import AttentionReporter
    from lmperf.attention.report import render, write_plots
    from lmperf.attention.spec import plan_sweep
    from lmperf.attention.sweep import SweepInterrupted, SweepOptions, run_sweep
    from lmperf.errors import SpecError
    from lmperf.runtime.device import resolve_device

    for name in ("timeout", "max_memory_gib"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise SpecError(f"--{name.replace('_', '-')} must be positive, got {value:g}")
    device = resolve_device(args.device)
    plan = plan_sweep(args.suite, device.type, impls=args.impl, seqs=args.seq, ds=args.d,
                      dtypes=args.dtype, batch=args.batch, heads=args.heads, causal=args.causal,
                      warmup=args.warmup, repeats=args.repeats, seed=args.seed,
                      threads=(1 if device.type == "cpu" else 0) if args.threads is None else args.threads)
    err = Console(stderr=True, soft_wrap=True)
    for note in plan.notes:
        err.print(f"note: {note}", highlight=False)
    options = SweepOptions(isolate=not args.inline, timeout_s=args.timeout,
                           max_memory_gib=args.max_memory_gib, resume=args.resume,
                           reporter=AttentionReporter(err))
    t0 = time.perf_counter()
    try:
        records = run_sweep(plan.specs, args.out, options)
    except SweepInterrupted as stop:
        err.print(f"interrupted: {len(stop.records)} finished configuration(s) are saved in "
                  f"{stop.out}; run the same command with --resume to finish the rest", highlight=False)
        return 130
    if not records:
        err.print(f"nothing to run: all {len(plan.specs)} configuration(s) are already ok in "
                  f"{args.out}", highlight=False)
        return 0
    sys.stdout.write(render(records, args.format))
    if args.plots:
        for path in write_plots(records, args.plots):
            err.print(f"plot: {path}", highlight=False)
    counts = {s: sum(r["status"] == s for r in records) for s in ("ok", "oom", "error", "unsupported")}
    err.print(f"{len(records)} configuration(s) in {time.perf_counter() - t0:.0f} s: "
              + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
              + f"; records appended to {args.out}", highlight=False)
    return 0
