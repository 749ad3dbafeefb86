"""`lmperf bench`: the flags (from the shared vocabulary) -> `lmperf.questions.bench.api.bench` -> Report."""

from __future__ import annotations

import argparse
from pathlib import Path

from lmperf.core.command import launch_kwargs, run_command
from lmperf.core.vocabulary import LAUNCH, add_compile, add_options, compile_values

DEFAULT_OUT = Path("results") / "bench.jsonl"
SPEC_OPTIONS = ("size", "course", "model", "context", "batch", "precision", "attention",
                "device", "threads", "warmup", "steps", "seed", "vocab_size")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `lmperf bench`."""
    from lmperf.names import MODES

    p = sub.add_parser("bench", help="time forward, backward and optimizer steps; sweep over lists",
                       description="Benchmark the reference LM (or your own) and append one JSON "
                                   "record per run to a results file. Every option that takes a "
                                   "list sweeps over the cartesian product.")
    add_options(p, SPEC_OPTIONS + ("out", "format") + LAUNCH + ("force",),
                lists=("size", "model", "context", "batch", "precision", "attention", "warmup"),
                defaults={"warmup": 5, "steps": 10, "out": DEFAULT_OUT},
                helps={"size": "default: tiny mini on CPU; the --course edition's table on CUDA",
                       "model": "several values: an A/B sweep, 'reference' naming the reference "
                                "LM; with --rounds the sides alternate run by run, then "
                                "`lmperf compare FILE --by model`",
                       "context": "default: 128 on CPU; on CUDA 512 (2026) or 128 256 512 1024 "
                                  "(2025)",
                       "precision": "default: fp32 bf16-mixed on CPU; fp32 on CUDA"})
    p.add_argument("--mode", metavar="MODE", nargs="+", default=["train-step"],
                   help=f"what a step does: {', '.join(MODES)}; several values sweep "
                        "(default: train-step)")
    p.add_argument("--optimizer", default="auto", choices=["auto", "fused", "foreach", "loop"],
                   help="AdamW implementation (default: auto, the fastest this device supports)")
    p.add_argument("--model-context", type=int, default=0, metavar="T",
                   help="the model's maximum context length (default: each run's --context)")
    add_compile(p, many=True)
    p.add_argument("--rounds", type=int, default=1, metavar="R",
                   help="run the whole grid R times, round-robin over the specs, and pool each "
                        "spec's samples (drift and bursts of load hit every spec alike; the "
                        "table shows the between-round spread) (default: 1)")
    p.add_argument("--clip", type=float, default=1.0, metavar="NORM",
                   help="train-step: unscale and clip gradients to this norm, as `lmperf train` "
                        "does (0: no clip step) (default: 1.0)")
    add_options(p, ("checkpoint", "float8"), lists=("checkpoint", "float8"),
                defaults={"checkpoint": ["none"], "float8": ["none"]},
                helps={"float8": "on a CPU where torch runs float8 scaled matmuls, else refused"})
    add_options(p, ("grad_accum",), helps={"grad_accum": "train-step"})
    p.add_argument("--predict", nargs="+", metavar="DEVICE", default=None,
                   help="run nothing: PREDICT each phase's time on these devices (GPUs of the "
                        "peak table, e.g. H100 B200 A100, or cpu: this machine's measured "
                        "ceilings) from per-operator counts of the model; a range in seconds, "
                        "ideal roofline .. typical attained fractions")
    add_options(p, ("host_us",), helps={"host_us": "with --predict GPU"})
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    """`lmperf bench`: expand the grid, check it, run the sweep, print the table."""
    from lmperf.questions.bench.api import bench

    kwargs = {name: getattr(args, name) for name in SPEC_OPTIONS}
    return run_command(args, lambda: bench(**kwargs, mode=args.mode, optimizer=args.optimizer,
                                           model_context=args.model_context, clip=args.clip,
                                           rounds=args.rounds,
                                           compile=compile_values(args),
                                           compile_mode=args.compile_mode,
                                           out=args.out, progress=True,
                                           predict=args.predict, host_us=args.host_us,
                                           force=args.force, checkpoint=args.checkpoint,
                                           float8=args.float8,
                                           grad_accum=args.grad_accum,
                                           **launch_kwargs(args)))
