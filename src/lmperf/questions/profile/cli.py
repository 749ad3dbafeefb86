"""`lmperf profile`: the flags (from the shared vocabulary) -> `lmperf.questions.profile.api.profile` ->
Report, plus the trace and CSV notes."""

from __future__ import annotations

import argparse
from pathlib import Path

from lmperf.core.command import emit, err, launch_kwargs, run_command
from lmperf.core.vocabulary import LAUNCH, add_compile, add_options, compile_values, device_defaults
from lmperf.errors import SpecError

DEFAULT_OUT = Path("results") / "profile.jsonl"
SPEC_OPTIONS = ("size", "course", "model", "context", "batch", "precision", "attention", "device",
                "threads", "warmup", "steps", "seed")
RUN_DESTS = SPEC_OPTIONS + ("mode", "optimizer", "model_context", "trace", "out") + LAUNCH


HELP = "where the time goes: per-phase operators/kernels, categories, attention"
# `lmperf profile --help` (one paragraph; line breaks here are not kept)
DESCRIPTION = " ".join("""
Profile one run (bench's flags, one value each) in a child process and print per-phase tables:
top operators (CPU) or kernels (CUDA), categories, matmul share, attention softmax vs matmuls.
The record is appended to a results file.
""".split())


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `lmperf profile`."""
    p = sub.add_parser("profile", help=HELP, description=DESCRIPTION)
    cpu, cuda = (device_defaults("profile", t) for t in ("cpu", "cuda"))
    per_device = {name: f"default: {cpu[name]} on CPU, {cuda[name]} on CUDA"
                  for name in ("size", "context", "precision")}
    # The profiler's schedule discards one more warm-up step of its own, so fewer are needed
    # here than in a benchmark; this keeps a profile within ~3x the time of its profiled steps.
    add_options(p, SPEC_OPTIONS + ("out", "format") + LAUNCH,
                defaults={"warmup": 2, "steps": 10, "out": DEFAULT_OUT},
                helps={**per_device,
                       "steps": "timed without the profiler, then as many profiled"})
    p.add_argument("--mode", default="train-step", metavar="MODE",
                   help="what a step does: forward, forward-backward, train-step "
                        "(default: train-step)")
    p.add_argument("--optimizer", default="auto", choices=["auto", "fused", "foreach", "loop"],
                   help="AdamW implementation (default: auto, the fastest this device supports)")
    p.add_argument("--model-context", type=int, default=0, metavar="T",
                   help="the model's maximum context length (default: the run's --context)")
    p.add_argument("--top", type=int, default=10, metavar="N",
                   help="rows per top table (default: 10)")
    p.add_argument("--trace", type=Path, metavar="FILE",
                   help="where to write the trace (default: traces/<run>.json beside --out)")
    add_compile(p, many=False)
    p.add_argument("--csv", type=Path, metavar="DIR", help="also write every table as CSV into DIR")
    p.add_argument("--from-trace", type=Path, metavar="FILE",
                   help="analyse an existing torch.profiler trace (.json or .json.gz, any size, "
                        "from any program, CPU-only or GPU) instead of running: the same tables, "
                        "steps from its ProfilerStep#N, phases from its annotations; takes --top, "
                        "--format, --csv only and writes no record")
    # The run options' defaults, to refuse them next to --from-trace (they would be ignored).
    p.set_defaults(func=cmd_profile, run_defaults={name: p.get_default(name) for name in RUN_DESTS})


def cmd_profile(args: argparse.Namespace) -> int:
    """`lmperf profile`: plan, run the job, print the tables and findings, append the record
    (or, with --from-trace, analyse that trace and print its tables)."""
    from lmperf.questions.profile.api import profile
    from lmperf.questions.profile.report import write_csv

    if args.from_trace is not None:
        return _from_trace(args)

    def produce():
        kwargs = {name: getattr(args, name) for name in SPEC_OPTIONS}
        report = profile(**kwargs, mode=args.mode, optimizer=args.optimizer,
                         model_context=args.model_context, top=args.top,
                         trace=args.trace, out=args.out, progress=True,
                         compile=compile_values(args), compile_mode=args.compile_mode,
                         **launch_kwargs(args))
        traces = [(r.get("metrics") or {}).get("trace_path") for r in report.records]
        for path in filter(None, traces):
            err(f"trace: {path} (opens in Perfetto / chrome://tracing)")
        if args.csv and report.tables:
            write_csv(report.tables, args.csv)
            err(f"CSV tables in {args.csv}")
        return report

    return run_command(args, produce, noun="profile")


def _from_trace(args: argparse.Namespace) -> int:
    """`lmperf profile --from-trace FILE`: the tables of an existing trace; no run, no
    record."""
    from lmperf.questions.profile.api import profile
    from lmperf.questions.profile.report import write_csv

    given = ["--" + name.replace("_", "-") for name, default in args.run_defaults.items()
             if getattr(args, name) != default]
    if given:
        raise SpecError(f"--from-trace analyses existing traces; {', '.join(given)} "
                        "appl(ies) to a run")
    if args.json:
        raise SpecError("--json prints records and --from-trace writes none; use --format csv "
                        "or --csv DIR for its tables")
    report = profile(from_trace=args.from_trace, top=args.top)
    emit(report, args)
    if args.csv and report.tables:
        write_csv({"time per step (ms)": report.frame, **report.tables}, args.csv)
        err(f"CSV tables in {args.csv}")
    return 0
