"""`lmperf profile`: one spec under torch.profiler (or Nsight Systems), tables per phase."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_OUT = Path("results") / "profile.jsonl"
DEFAULT_TRACE_DIR = Path("results") / "traces"


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `lmperf profile`."""
    from lmperf.cli import add_spec_arguments

    p = sub.add_parser("profile", help="where the time goes: per-phase operators/kernels, categories, attention",
                       description="Profile one run (the same flags as bench, one value each) and "
                                   "print per-phase tables: top operators (CPU) or kernels (CUDA), "
                                   "categories, matmul share, attention softmax vs matmuls.")
    # The profiler's schedule discards one more warm-up step of its own, so fewer are needed
    # here than in a benchmark; this keeps a profile within ~3x the time of its profiled steps.
    add_spec_arguments(p, sweep=False, warmup=2)
    p.add_argument("--backend", default="torch", choices=["torch", "nsys"],
                   help="torch.profiler (default; CPU and CUDA) or Nsight Systems (needs nsys on PATH)")
    p.add_argument("--top", type=int, default=10, help="rows per top table (default: 10)")
    p.add_argument("--trace", type=Path, metavar="FILE",
                   help=f"where to write the trace (default: {DEFAULT_TRACE_DIR}/<run>.json)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help=f"JSONL results file the record is appended to (default: {DEFAULT_OUT})")
    p.add_argument("--format", default="text", choices=["text", "markdown"])
    p.add_argument("--csv", type=Path, metavar="DIR", help="also write every table as CSV into DIR")
    p.set_defaults(func=cmd_profile)


def cmd_profile(args: argparse.Namespace) -> int:
    """Run the profile, print the tables and findings, append the record."""
    from lmperf.workload.build import resolve_optimizer
    from lmperf.workload.spec import RunSpec
    from lmperf.errors import SpecError
    from lmperf.profile.record import render, to_record, write_csv
    from lmperf.results.store import append_record, ensure_writable
    from lmperf.runtime.device import resolve_device

    if args.top <= 0:
        raise SpecError(f"--top must be a positive integer, got {args.top}")
    device = resolve_device(args.device)
    size = args.size or ("small" if device.type == "cuda" else "mini")
    spec = RunSpec.from_size(size, context_length=args.context or 128,
                             model_context_length=args.model_context, batch_size=args.batch,
                             precision=args.precision or "fp32", mode=args.mode,
                             attention=args.attention,
                             optimizer=resolve_optimizer(args.optimizer, device),
                             warmup=args.warmup, steps=args.steps, seed=args.seed,
                             device=device.type, model=args.model)
    if args.model:
        from lmperf.workload.build import check_user_models

        check_user_models([spec])
    ensure_writable(args.out)
    trace = args.trace or DEFAULT_TRACE_DIR / (spec.label().replace(" ", "_").replace("=", "") + ".json")
    if args.backend == "nsys":
        from lmperf.profile.nsys_run import profile_nsys

        result = profile_nsys(spec, trace.with_suffix(""), top=args.top)
    else:
        from lmperf.profile.run import profile_torch

        print(f"profiling {spec.label()}: {spec.warmup} warm-up, {spec.steps} unprofiled and "
              f"{spec.steps} profiled steps ...", file=sys.stderr)
        result = profile_torch(spec, trace, top=args.top)
    record = to_record(result)
    append_record(args.out, record)
    sys.stdout.write(render(result, args.format))
    if args.csv:
        write_csv(result, args.csv)
    print(f"trace: {result.trace_path} (opens in Perfetto / chrome://tracing); record appended to "
          f"{args.out}" + (f"; CSV tables in {args.csv}" if args.csv else ""), file=sys.stderr)
    return 0
