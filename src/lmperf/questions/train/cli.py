"""`lmperf train`: the flags (from the shared vocabulary) -> `lmperf.questions.train.api.train` -> Report."""

from __future__ import annotations

import argparse
from pathlib import Path

from lmperf.core.command import launch_kwargs, run_command
from lmperf.core.vocabulary import LAUNCH, add_compile, add_options, compile_values

DEFAULT_OUT = Path("results") / "train.jsonl"
PLOTS_FOLDER = "train-plots"  # beside --out unless --plots names a folder
SPEC_OPTIONS = ("size", "course", "context", "batch", "precision", "attention", "device", "threads",
                "steps", "seed")
TRAIN_OPTIONS = ("lr", "lr_warmup", "clip", "eps", "eval_interval", "eval_batches", "data",
                 "tokens", "vocab_size")


HELP = "train a small LM under each precision regime: loss, scale, time, memory"
# `lmperf train --help` (one paragraph; line breaks here are not kept)
DESCRIPTION = " ".join("""
Train the reference LM once per precision regime, from the same seed on the same batches, and
compare loss curves, gradient norms, GradScaler scale, step time and memory. Each regime is one
job (its own process unless --inline); one whose loss turns NaN or diverges stops there with
that outcome recorded, one that does not fit is an oom row; the others go on.
""".split())


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `lmperf train`."""
    p = sub.add_parser("train", help=HELP, description=DESCRIPTION)
    add_options(p, SPEC_OPTIONS + ("out", "format", "plots", "float8") + LAUNCH,
                lists=("precision", "float8"),
                defaults={"batch": None, "out": DEFAULT_OUT, "plots": None, "float8": ["none"]},
                helps={"size": "default: tiny on CPU, mini on CUDA",
                       "context": "tokens per window (default: 64 on CPU, 256 on CUDA)",
                       "batch": "windows per step (default: 16 on CPU, 32 on CUDA)",
                       "precision": "the regimes to train, in order (default: fp32 bf16-mixed "
                                    "bf16-true on CPU; the fp16 regimes join on CUDA)",
                       "steps": "optimizer steps per regime, each timed (default: 200 on CPU, "
                                "500 on CUDA)",
                       "plots": "train.png is overwritten each run (default: train-plots/ beside "
                                "--out)",
                       "float8": "a bf16 regime trained again with it, its curve beside the "
                                 "regime's (fp32 runs at none)"})
    p.add_argument("--no-plots", action="store_true", help="skip the PNG")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default: 3e-3)")
    p.add_argument("--lr-warmup", type=int, default=20, metavar="N",
                   help="learning-rate warm-up: N steps of linear warm-up, then cosine decay to "
                        "lr/10 (default: 20)")
    p.add_argument("--clip", type=float, default=1.0, metavar="NORM",
                   help="max gradient norm, applied after unscaling; 0: no clipping (the norm is "
                        "still recorded) (default: 1.0)")
    p.add_argument("--eps", type=float, default=1e-8,
                   help="AdamW eps (default: 1e-8; note it is 0 in fp16, see fp16-true)")
    p.add_argument("--eval-interval", type=int, default=50, metavar="N",
                   help="steps between validation losses (default: 50)")
    p.add_argument("--eval-batches", type=int, default=8, metavar="N",
                   help="fixed validation batches per evaluation (default: 8)")
    data = p.add_mutually_exclusive_group()
    data.add_argument("--data", type=Path, metavar="FILE.txt",
                      help="train on a text file, byte-level (default: the bundled generated corpus)")
    data.add_argument("--tokens", type=Path, metavar="FILE",
                      help="train on a token file: a flat uint16 array of ids (raw, as "
                           "ids.tofile(), or .npy), read by memory map")
    add_options(p, ("vocab_size",), helps={"vocab_size": "default: 256 for text, 10000 for "
                                                         "--tokens"})
    add_compile(p, many=True)  # a second axis beside --precision
    p.set_defaults(func=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    """`lmperf train`: check everything, train each regime as one job, print the table."""
    from lmperf.questions.train.api import train

    kwargs = {name: getattr(args, name) for name in SPEC_OPTIONS + TRAIN_OPTIONS}
    kwargs["compile"] = compile_values(args)
    kwargs["compile_mode"] = args.compile_mode
    kwargs["float8"] = args.float8
    # beside the results file, not in the working directory: a run with --out elsewhere leaves
    # nothing behind here (as dist's plots and profile's traces)
    plots = None if args.no_plots else (args.plots or Path(args.out).parent / PLOTS_FOLDER)
    return run_command(args, lambda: train(**kwargs, plots=plots,
                                           out=args.out, progress=True, **launch_kwargs(args)),
                       noun="regime")
