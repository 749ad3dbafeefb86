"""`lmperf attention`: the flags (shared vocabulary + the suite's own) -> `lmperf.attention(...)`."""

from __future__ import annotations

import argparse
from pathlib import Path

from lmperf.core.command import launch_kwargs, run_command
from lmperf.core.vocabulary import LAUNCH, add_options

DEFAULT_OUT = Path("results") / "attention.jsonl"
SHARED = ("attention", "context", "batch", "device", "threads", "warmup", "steps", "seed")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `lmperf attention`."""
    from lmperf.questions.attention.spec import DTYPES, SUITES

    p = sub.add_parser(
        "attention", help="naive vs SDPA vs compiled vs FlashAttention-2: latency and memory vs "
                          "context",
        description="Sweep attention implementations over batch x heads x d x context x "
                    "precision, one child process per configuration: forward, backward and "
                    "fwd+bwd latency, the memory left for backward next to the analytic score "
                    "matrix, OOM as a row. Suites follow the course and are scaled down on the CPU.")
    add_options(p, SHARED + ("out", "format", "plots") + LAUNCH,
                lists=("attention", "context"),
                defaults={"attention": None, "batch": None, "warmup": 2, "steps": 5,
                          "out": DEFAULT_OUT},
                helps={"attention": "default: the suite's", "context": "default: the suite's",
                       "batch": "default: the suite's", "steps": "timed calls per pass",
                       "warmup": "untimed calls per pass", "seed": "here: of q, k, v and dO"})
    # The shared --precision names training regimes (bf16-mixed, ...); attention runs no
    # regime, only tensors of one dtype, so its option is --dtype (as torch names it).
    p.add_argument("--dtype", nargs="+", metavar="DTYPE",
                   help=f"tensor dtype of q, k, v and the output (not a training regime: no "
                        f"autocast): {', '.join(DTYPES)}; "
                        "several values sweep (default: the suite's)")
    p.add_argument("--suite", default="flash", choices=list(SUITES),
                   help="; ".join(f"{s.name}: {s.summary}" for s in SUITES.values())
                        + " (default: flash)")
    p.add_argument("--d", nargs="+", type=int, metavar="D",
                   help="head dimensions; several values sweep (default: the suite's)")
    p.add_argument("--heads", type=int, metavar="H", help="heads (default: the suite's)")
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=None,
                   help="causal mask (default: the suite's: flash causal, pytorch not)")
    p.set_defaults(func=cmd_attention)


def cmd_attention(args: argparse.Namespace) -> int:
    """`lmperf attention`: plan, run the sweep, print the tables and findings, write plots."""
    from lmperf.questions.attention.api import attention

    kwargs = {name: getattr(args, name) for name in SHARED}
    return run_command(args, lambda: attention(
        **kwargs, suite=args.suite, d=args.d, heads=args.heads, dtype=args.dtype,
        causal=args.causal, plots=args.plots, out=args.out, progress=True,
        **launch_kwargs(args)), noun="configuration")
