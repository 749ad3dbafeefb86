"""`lmperf amp ...`: the precision lab's subcommands (registered by lmperf.cli)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lmperf.core.vocabulary import add_options

DEFAULT_OUT = Path("results") / "amp.jsonl"
DEFAULT_REPORT = Path("results") / "amp-report"


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `lmperf amp` with one subcommand per experiment, plus `all`."""
    from lmperf.questions.amp import EXPERIMENT_NAMES, get_experiment

    amp = sub.add_parser("amp", help="the precision lab: formats, autocast policy, loss scaling, ...",
                         description="Precision experiments, run on this device and this torch. "
                                     "With no experiment, list them.")
    amp.set_defaults(func=cmd_list)
    experiments = amp.add_subparsers(dest="experiment", metavar="EXPERIMENT",
                                     parser_class=type(amp))
    for name in EXPERIMENT_NAMES:
        module = get_experiment(name)
        p = experiments.add_parser(name, help=module.SUMMARY, description=module.SUMMARY)
        module.add_arguments(p)
        _add_common(p, plots=hasattr(module, "plot"))
        p.set_defaults(func=cmd_run)
    p = experiments.add_parser("all", help="run every experiment; write one Markdown report with plots")
    p.add_argument("--report", type=Path, default=DEFAULT_REPORT,
                   help=f"folder for report.md and its PNGs (default: {DEFAULT_REPORT})")
    _add_common(p, plots=False)
    p.set_defaults(func=cmd_all)


def _add_common(p: argparse.ArgumentParser, plots: bool) -> None:
    add_options(p, ("device", "threads", "out", "format", "inline", "timeout", "max_memory_gib",
                    "resume") + (("plots",) if plots else ()), defaults={"out": DEFAULT_OUT})


def cmd_list(args: argparse.Namespace) -> int:
    """`lmperf amp`: one line per experiment."""
    from lmperf.questions.amp import EXPERIMENT_NAMES, get_experiment

    print("lmperf amp EXPERIMENT [options]   (lmperf amp EXPERIMENT --help for its options)\n")
    for name in EXPERIMENT_NAMES:
        print(f"  {name:<11} {get_experiment(name).SUMMARY}")
    print(f"  {'all':<11} run every experiment and write one Markdown report with plots")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """`lmperf amp NAME`: run one experiment, print its tables (or --json), record it."""
    from lmperf.questions.amp import get_experiment
    from lmperf.questions.amp.api import amp
    from lmperf.questions.amp.job import option_names
    from lmperf.core.command import err, launch_kwargs, run_command

    options = {k: getattr(args, k) for k in option_names(get_experiment(args.experiment))
               if hasattr(args, k)}
    plots = getattr(args, "plots", None)
    code = run_command(args, lambda: amp(args.experiment, device=args.device, out=args.out,
                                         plots=plots, threads=args.threads,
                                         **launch_kwargs(args), **options),
                       noun="experiment")
    png = Path(plots) / f"{args.experiment}.png" if plots is not None else None
    if png is not None and png.exists():
        err(f"plot: {png}")
    return code


def cmd_all(args: argparse.Namespace) -> int:
    """`lmperf amp all`: every experiment as its own job, one Markdown report; exit 1 when one
    of them failed (its row says why; the others ran)."""
    from lmperf.core.command import emit_json, launch_kwargs
    from lmperf.questions.amp.api import amp
    from lmperf.questions.amp.report import write_markdown

    report = amp("all", device=args.device, out=args.out, plots=args.report, progress=True,
                 threads=args.threads, **launch_kwargs(args))
    path = write_markdown(report.records, args.report)
    if args.json:
        emit_json(report, args.json)
    failed = [r["spec"].get("experiment", "?") for r in report.records if r["status"] != "ok"]
    print(f"report: {path}" + (f" ({len(failed)} failed: {', '.join(failed)})" if failed else ""),
          file=sys.stderr)
    return 1 if failed else 0
