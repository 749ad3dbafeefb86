"""`lmperf plan`: the flags -> `lmperf.questions.plan.api.plan` -> Report."""

from __future__ import annotations

import argparse
from pathlib import Path

from lmperf.core.command import run_command
from lmperf.core.vocabulary import LAYOUT, add_compile, add_options
from lmperf.questions.plan.spec import CONTEXT, GLOBAL_BATCH

DEFAULT_OUT = Path("results") / "plan.jsonl"
HELP = "what to run, will it fit, how fast: the fastest configuration that fits (predicted)"
DESCRIPTION = (
    "Searches precision x activation checkpointing x layout (DDP, ZeRO-1/2, FSDP, HSDP; tensor "
    "parallelism with sequence parallelism, pipeline schedules, context parallelism) x "
    "micro-batch for a model on GPUs you may not have (--gpu NAME --gpus N), ranks what fits "
    "by predicted step time and names the winner and the command that runs it. Every figure is "
    "PREDICTED (simulated memory, modelled time); --confirm K runs K plans on this CPU's ranks "
    "and scores the prediction.")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `lmperf plan`."""
    p = sub.add_parser("plan", help=HELP, description=DESCRIPTION)
    add_options(p, ("size", "course", "model", "attention", "out", "format"),
                defaults={"out": DEFAULT_OUT, "attention": "sdpa"},
                helps={"size": "a preset (default: mini), e.g. llama3-8b",
                       "attention": "default: sdpa (a fused kernel)"})
    add_options(p, ("gpu", "gpus", "gpus_per_node", "gib", "host_us", "node_bandwidth"),
                defaults={"gpus": 1},
                helps={"gpu": "default: the one at hand", "gib": "required on the CPU"})
    g = p.add_argument_group("layout (each flag one or more values; a dimension not given is "
                             "searched over all its values)")
    add_options(g, LAYOUT, lists=LAYOUT)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="cpu: plan for this machine's ranks (gloo), as --confirm runs them")
    p.add_argument("--context", type=int, default=CONTEXT, metavar="T",
                   help=f"tokens per sequence (default: {CONTEXT})")
    p.add_argument("--global-batch", type=int, default=GLOBAL_BATCH, metavar="B",
                   help=f"sequences per optimizer step over all ranks (default: {GLOBAL_BATCH})")
    p.add_argument("--precision", nargs="+", metavar="P", dest="plan_precision",
                   help="bf16-mixed, bf16-fsdp (GPU default: both); fp32 (CPU default), bf16-mixed")
    add_options(p, ("checkpoint", "float8"), lists=("checkpoint", "float8"),
                defaults={"checkpoint": None, "float8": None},
                helps={"checkpoint": "the policies searched (default: none op full)",
                       "float8": "the recipes searched (default: none rowwise where the GPU has "
                                 "FP8 tensor cores)"})
    add_compile(p, True, searched=True)
    p.add_argument("--confirm", type=int, default=0, metavar="K",
                   help="run K plans here (CPU ranks, --gib per rank; or --gpus 1: this CPU or "
                        "the GPU at hand) at b and b + 1; score the plan")
    p.add_argument("--top", type=int, default=10, metavar="N",
                   help="distinct plans shown per search, besides the best of each strategy "
                        "(default: 10; the records hold all)")
    p.add_argument("--timeout", type=float, metavar="S", help="--confirm's limit per launch")
    p.set_defaults(func=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    """`lmperf plan`: search, print the ranked table, the winner and its command."""
    from lmperf.questions.plan.api import plan

    return run_command(args, lambda: plan(
        args.size, model=args.model, gpu=args.gpu, gpus=args.gpus,
        gpus_per_node=args.gpus_per_node, gib=args.gib, device=args.device, context=args.context,
        global_batch=args.global_batch, precision=args.plan_precision, checkpoint=args.checkpoint,
        attention=args.attention, host_us=args.host_us, confirm=args.confirm,
        course=args.course, out=args.out, timeout=args.timeout, top=args.top,
        node_bandwidth=args.node_bandwidth, compile=args.compile, float8=args.float8,
        **{name: getattr(args, name) for name in LAYOUT}))
