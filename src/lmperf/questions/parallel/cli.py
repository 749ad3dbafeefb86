"""`lmperf dist [comm|train] ...` and `lmperf dist --estimate ...` -> `lmperf.questions.parallel.api.dist`."""

from __future__ import annotations

import argparse
from pathlib import Path

from lmperf.core.command import run_command
from lmperf.core.vocabulary import add_options

DEFAULT_OUT = Path("results") / "dist.jsonl"
SHARED = ("size", "course", "context", "batch", "device", "threads", "warmup", "steps", "seed")
COMM = ("collective", "sizes", "dtype", "iters")
TRAIN = ("strategy", "profile_steps", "lr", "bucket_mb", "compute_dtype", "vocab_size",
         "checkpoint", "grad_accum")
# the layout flags of the shared vocabulary (core.vocabulary.LAYOUT) that dist train runs;
# --tp also sets --estimate's FSDP x TP rows
LAYOUT = ("tp", "pp", "cp", "dp_replicate", "pp_schedule", "pp_virtual", "micro_batch")
ESTIMATE = ("gpus", "d_model", "d_ff", "num_layers", "ffn_only", "tokens", "gpu", "bandwidth",
            "gib", "comm_dtype", "node_bandwidth", "gpus_per_node")


HELP = "data parallelism: collectives, DDP/FSDP/ZeRO strategies, estimates"
# `lmperf dist --help` (one paragraph; line breaks here are not kept)
DESCRIPTION = " ".join("""
What data parallelism costs and how much communication is hidden. `comm` times collectives
(nccl-tests' algbw/busbw, slowest rank per iteration); `train` runs every data-parallel strategy
on the same model and data (phase times, communication / overlap / exposed, bytes, memory, and
equality with single-process training); no command runs both. Each (command, world size) is one
torchrun launch (gloo on CPU, NCCL on GPUs); a rank that crashes, hangs past --timeout or runs
out of memory is a row naming the rank. --estimate runs nothing: memory and communication of
the course's accounting model on clusters you do not have (a preset LM: `lmperf plan`).
Many nodes: run `torchrun --nnodes N --nproc-per-node G --rdzv-backend c10d --rdzv-endpoint
HOST:PORT -m lmperf dist comm|train ...` on each node (rank 0 appends to --out).
""".split())


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `lmperf dist`."""
    from lmperf.questions.parallel.spec import COLLECTIVES, DTYPES, STRATEGIES

    p = sub.add_parser("dist", help=HELP, description=DESCRIPTION)
    p.add_argument("what", nargs="?", default="all",
                   choices=["all", "comm", "train"], help="comm, train, or both (default)")
    p.add_argument("--estimate", action="store_true",
                   help="estimate data-parallel strategies, tensor parallelism and FSDP x TP "
                        "of the course's accounting model (--ffn-only) on --gpus N... of --gpu "
                        "(memory and communication per device and step, fits?); runs nothing")
    add_options(p, SHARED + ("out", "format", "plots", "timeout", "max_memory_gib", "resume"),
                defaults={"batch": None, "seed": 0, "out": DEFAULT_OUT},
                helps={"size": "train: model preset (default: tiny on CPU, xl on CUDA)",
                       "context": "train: tokens per sequence (default: 64 on CPU, 128 on CUDA)",
                       "batch": "train: sequences per rank (per data-parallel replica in a "
                                "layout) per step (default: 4)",
                       "warmup": "untimed iterations (comm, default 5) or steps (train, "
                                 "default 2 on CPU, 3 on CUDA)",
                       "steps": "train: timed steps (default: 5 on CPU, 10 on CUDA)",
                       "timeout": "per item (a collective at a size, or a strategy): kill every "
                                  "rank and record an error naming the hung rank (default: 300)",
                       "plots": "dist-train.png and dist-comm.png are overwritten each run "
                                "(default: dist-plots/ beside --out)"})
    p.add_argument("--no-plots", action="store_true", help="skip the PNGs")
    p.add_argument("--world-size", type=int, nargs="+", metavar="N",
                   help="ranks launched here; several values sweep (default: comm 2 4, train 1 2 "
                        "on CPU; every local GPU count on CUDA); --estimate counts the target's "
                        "GPUs with --gpus")
    g = p.add_argument_group("comm")
    g.add_argument("--collective", nargs="+", metavar="NAME",
                   help=f"collectives ({', '.join(COLLECTIVES)}; default: all)")
    g.add_argument("--sizes", nargs="+", metavar="S",
                   help="message sizes, bytes or with a unit (1KiB 16MiB 1MB 1GB); nccl-tests' S "
                        "(default: 1KiB 16KiB 256KiB 1MiB 4MiB 16MiB on CPU; 1MB to 1GB on CUDA)")
    g.add_argument("--dtype", default="fp32", choices=DTYPES,
                   help="the messages' tensor dtype, not a precision regime (default: fp32)")
    g.add_argument("--iters", type=int, default=20, metavar="N",
                   help="timed iterations per collective and size (default: 20)")
    g = p.add_argument_group("train")
    g.add_argument("--strategy", nargs="+", metavar="NAME",
                   help=f"strategies ({', '.join(STRATEGIES)}; default: all)")
    g.add_argument("--profile-steps", type=int, default=2, metavar="N",
                   help="steps under torch.profiler for communication / overlap / bytes (0: none) "
                        "(default: 2)")
    g.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default: 1e-3)")
    add_options(g, ("vocab_size",), helps={"vocab_size": "train: the preset's (default: its own)"})
    g.add_argument("--bucket-mb", type=float, default=1.0, metavar="MIB",
                   help="bucket size of bucketed, torch-ddp, zero1, torch-zero1 (default: 1)")
    g.add_argument("--compute-dtype", default="fp32", choices=DTYPES,
                   help="compute and communication tensor dtype of fsdp2 and torch-zero2, not a "
                        "precision regime (default: fp32)")
    add_options(g, ("checkpoint", "grad_accum"), defaults={"checkpoint": "none"},
                helps={"grad_accum": "--batch is per rank"})
    g.add_argument("--no-reference", action="store_true",
                   help="skip the check against one process on the global batch (and gathering "
                        "the full parameters): a model one device cannot hold")
    g = p.add_argument_group("train: layouts (TP, PP, HSDP; --batch is then per data-parallel "
                             "replica, --strategy its data-parallel part: fsdp2, or none)")
    add_options(g, LAYOUT, lists=LAYOUT,
                helps={"tp": "train: with sequence and loss parallelism (DTensor); --estimate: "
                             "the degrees of its FSDP x TP rows (default: 2 4 8)",
                       "cp": "train: refused (torch's context_parallel runs CUDA kernels only)",
                       "dp_replicate": "train: HSDP with --strategy fsdp2",
                       "pp_schedule": "train: default 1F1B",
                       "pp_virtual": "train: default 2 for a looped schedule, else 1",
                       "micro_batch": "train: default 1"})
    g = p.add_argument_group("--estimate")
    add_options(g, ("gpu", "gpus", "gpus_per_node", "gib"), lists=("gpus",),
                helps={"gpu": "default: H100-SXM", "gpus": "one row each (default: 8 64 512)"})
    add_options(g, ("d_model", "d_ff", "num_layers"),
                helps={"d_model": "with --d-ff, --num-layers and --ffn-only"})
    g.add_argument("--ffn-only", action="store_true",
                   help="the course's accounting model: two Linear layers per block, nothing else")
    g.add_argument("--tokens", type=int, default=2**20, metavar="T",
                   help="tokens per step over all ranks (default: 1048576)")
    g.add_argument("--bandwidth", type=float, metavar="GB/s",
                   help="link bandwidth per device and direction within a node, 1e9 B/s "
                        "(default: --gpu's)")
    add_options(g, ("node_bandwidth",))
    g.add_argument("--comm-dtype", default="bf16", choices=DTYPES,
                   help="the dtype of the course's accounting column comm_gb (every message "
                        "in it); the times are the one model's (default: bf16)")
    p.add_argument("--precision", choices=("fp32", "bf16-mixed"),
                   help="train: fp32 (the default) or bf16-mixed (bf16 autocast over fp32 "
                        "weights)")
    p.add_argument("--attention", help="train: the reference LM's attention (default: naive)")
    # what the --estimate options are when not given: cmd_dist refuses them without --estimate
    p.set_defaults(func=cmd_dist, estimate_defaults={n: p.get_default(n) for n in ESTIMATE})


def run_kwargs(args: argparse.Namespace) -> dict:
    """The keywords of a dist comm / train run (API and plan) from its parsed flags."""
    return {"precision": args.precision or "fp32", "attention": args.attention or "naive",
            "reference": not args.no_reference,
            **{name: getattr(args, name) for name in SHARED + COMM + TRAIN + LAYOUT}}


def cmd_dist(args: argparse.Namespace) -> int:
    """`lmperf dist`: plan, launch torchrun per (command, world size), print the tables."""
    from lmperf.questions.parallel.api import dist

    given = [f"--{n.replace('_', '-')}" for n in ESTIMATE
             if getattr(args, n) != args.estimate_defaults[n]]
    if given and not args.estimate:
        from lmperf.errors import SpecError

        raise SpecError(f"{', '.join(given)}: {'an option' if len(given) == 1 else 'options'} "
                        f"of --estimate only (add --estimate, or leave out)")

    if args.estimate:  # nothing runs, nothing is written: no closing line
        from lmperf.core.command import emit

        if args.world_size is not None:
            from lmperf.errors import SpecError

            raise SpecError("--world-size is the ranks launched here; --estimate counts the "
                            "target's GPUs with --gpus N...")
        train_only = [f"--{n.replace('_', '-')}" for n in LAYOUT[1:] if getattr(args, n)]
        if train_only:
            from lmperf.errors import SpecError

            raise SpecError(f"{', '.join(train_only)}: dist train's layout (--estimate takes "
                            "--tp for its FSDP x TP rows; `lmperf plan` prices layouts)")
        kwargs = {name: getattr(args, name) for name in ESTIMATE if name != "gpus"}
        emit(dist("estimate", world_size=args.gpus, size=args.size, context=args.context,
                  batch=args.batch, tp=args.tp, **kwargs), args)
        return 0
    from lmperf.questions.parallel.plots import default_folder

    kwargs = run_kwargs(args)
    plots = None if args.no_plots else (args.plots or default_folder(args.out))
    ran = []

    def produce():
        ran.append(dist(args.what, world_size=args.world_size, **kwargs, plots=plots,
                        out=args.out, timeout=args.timeout, max_memory_gib=args.max_memory_gib,
                        resume=args.resume, progress=True))
        return ran[0]

    code = run_command(args, produce, noun="item")
    records = ran[0].records if ran else []
    # every item failed: nothing was measured, and a script must see it (a failed row among
    # ok ones is a result, exit 0)
    return 1 if code == 0 and records and all(r["status"] != "ok" for r in records) else code
