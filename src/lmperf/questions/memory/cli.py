"""`lmperf memory`: the flags (from the shared vocabulary) -> `lmperf.questions.memory.api.memory` -> Report."""

from __future__ import annotations

import argparse
from pathlib import Path

from lmperf.core.command import emit, launch_kwargs, run_command
from lmperf.core.vocabulary import LAUNCH, add_options

DEFAULT_OUT = Path("results") / "memory.jsonl"
HELP = "where the memory goes: peaks per phase, saved activations, estimates, checkpointing, " \
       "CUDA snapshots"
DESCRIPTION = (
    "Peak memory per phase (forward-only and train step) across context lengths, what autograd "
    "saves per block, the simulated estimate (--estimate, --gib, --gpu), activation checkpointing's "
    "trade-off (--checkpoint) and CUDA snapshot summaries (--snapshot). Measurements run in a "
    "child process per precision and analysis. CPU figures are process RSS, never GPU memory.")
SPEC_OPTIONS = ("size", "course", "model", "context", "batch", "precision", "attention", "device",
                "threads", "warmup", "steps", "seed", "vocab_size")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `lmperf memory`."""
    from lmperf.names import MODES

    p = sub.add_parser("memory", help=HELP, description=DESCRIPTION)
    # One model per run: --context and --precision take lists (rows and columns of the tables).
    add_options(p, SPEC_OPTIONS + ("out", "format", "plots") + LAUNCH + ("force",),
                lists=("context", "precision"),
                defaults={"warmup": 1, "steps": 3, "out": DEFAULT_OUT, "attention": None},
                helps={"size": "default: mini on CPU, small on CUDA",
                       "attention": "default: sdpa with --gpu (what lmperf plan assumes), "
                                    "else naive (the course's)",
                       "model": "no --estimate or --checkpoint for it",
                       "context": "default: 128 256 512 on CPU; up to 1024 on CUDA",
                       "precision": "one column each (default: fp32)",
                       "warmup": "AdamW's state exists after the first train step (0: the "
                                 "measured step creates it)",
                       "steps": "timed steps per --checkpoint policy",
                       "plots": "memory vs context (with --snapshot: active memory over time)"})
    p.add_argument("--mode", nargs="+", metavar="MODE", default=["forward", "train-step"],
                   help=f"steps to measure: {', '.join(MODES)} (default: forward train-step)")
    p.add_argument("--optimizer", default="auto", choices=["auto", "fused", "foreach", "loop"],
                   help="AdamW implementation (default: auto)")
    p.add_argument("--model-context", type=int, default=0, metavar="T",
                   help="the model's maximum context length (default: the longest --context)")
    p.add_argument("--estimate", action="store_true",
                   help="simulate each step instead of running it (nothing is allocated; "
                        "--device cuda estimates for a GPU from any machine)")
    add_options(p, ("gib", "gpu"), helps={"gib": "will it fit? (implies --estimate)",
                                          "gpu": "will it fit on it? (implies --estimate "
                                                 "--device cuda)"})
    add_options(p, ("checkpoint", "float8"), lists=("checkpoint",),
                helps={"checkpoint": "the trade-off over these policies (none first)",
                       "float8": "measured, not with --estimate"})
    p.add_argument("--snapshot", type=Path, metavar="FILE",
                   help="summarise a CUDA memory snapshot pickle (no browser, no GPU needed)")
    p.add_argument("--top", type=int, default=10, help="rows of the top tables (default: 10)")
    p.set_defaults(func=cmd_memory)


def cmd_memory(args: argparse.Namespace) -> int:
    """`lmperf memory`: run what the flags ask for, print tables and findings, append records."""
    from lmperf.questions.memory.api import memory, snapshot_report

    if args.snapshot is not None:  # a summary of a file: nothing runs, no records
        emit(snapshot_report(args.snapshot, args.plots), args)
        return 0
    kwargs = {name: getattr(args, name) for name in SPEC_OPTIONS}
    return run_command(args, lambda: memory(
        **kwargs, mode=args.mode, optimizer=args.optimizer, model_context=args.model_context,
        estimate=args.estimate, gib=args.gib, gpu=args.gpu, checkpoint=args.checkpoint,
        float8=args.float8, top=args.top,
        plots=args.plots, out=args.out, progress=True, force=args.force, **launch_kwargs(args)))
