"""`lmperf amp ...`: the precision lab's subcommands (registered by lmperf.cli)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_OUT = Path("results") / "amp.jsonl"
DEFAULT_REPORT = Path("results") / "amp-report"


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `lmperf amp` with one subcommand per experiment, plus `all`."""
    from lmperf.amp import EXPERIMENT_NAMES, get_experiment

    amp = sub.add_parser("amp", help="the precision lab: formats, autocast policy, loss scaling, ...",
                         description="Precision experiments, run on this device and this torch. "
                                     "With no experiment, list them.")
    amp.set_defaults(func=cmd_list)
    experiments = amp.add_subparsers(dest="experiment", metavar="EXPERIMENT", parser_class=type(amp))
    for name in EXPERIMENT_NAMES:
        module = get_experiment(name)
        p = experiments.add_parser(name, help=module.SUMMARY, description=module.SUMMARY)
        module.add_arguments(p)
        _add_common(p)
        if hasattr(module, "plot"):
            p.add_argument("--plot", type=Path, metavar="PNG", help="also draw the result to this PNG")
        p.set_defaults(func=cmd_run)
    p = experiments.add_parser("all", help="run every experiment; write one Markdown report with plots")
    p.add_argument("--report", type=Path, default=DEFAULT_REPORT,
                   help=f"folder for report.md and its PNGs (default: {DEFAULT_REPORT})")
    _add_common(p, json=False)
    p.set_defaults(func=cmd_all)


def _add_common(p: argparse.ArgumentParser, json: bool = True) -> None:
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="(default: auto)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help=f"JSONL results file the record is appended to (default: {DEFAULT_OUT})")
    if json:
        p.add_argument("--json", type=Path, metavar="FILE", help="also write the record to FILE as JSON")
        p.add_argument("--format", default="text", choices=["text", "markdown"])


def cmd_list(args: argparse.Namespace) -> int:
    """`lmperf amp`: one line per experiment."""
    from lmperf.amp import EXPERIMENT_NAMES, get_experiment

    print("lmperf amp EXPERIMENT [options]   (lmperf amp EXPERIMENT --help for its options)\n")
    for name in EXPERIMENT_NAMES:
        print(f"  {name:<11} {get_experiment(name).SUMMARY}")
    print(f"  {'all':<11} run every experiment and write one Markdown report with plots")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """`lmperf amp NAME`: run one experiment, print its tables, record it."""
    from lmperf.amp import get_experiment, render
    from lmperf.amp.runner import option_names, run_experiment, write_json
    from lmperf.results.store import append_record, ensure_writable
    from lmperf.runtime.device import resolve_device

    device = resolve_device(args.device)
    ensure_writable(args.out)
    options = {k: getattr(args, k) for k in option_names(get_experiment(args.experiment)) if hasattr(args, k)}
    outcome = run_experiment(args.experiment, device, options, getattr(args, "plot", None))
    append_record(args.out, outcome.record)
    if args.json:
        write_json(outcome, args.json)
    if outcome.result is None:
        print(f"lmperf: amp {args.experiment} failed: {outcome.record['message']}", file=sys.stderr)
        return 1
    sys.stdout.write(render(outcome.result, args.format))
    extra = [f"plot: {outcome.plot_path}"] if outcome.plot_path else []
    extra += [f"json: {args.json}"] if args.json else []
    print(f"({outcome.seconds:.1f} s; record appended to {args.out}"
          + "".join(f"; {e}" for e in extra) + ")", file=sys.stderr)
    return 0


def cmd_all(args: argparse.Namespace) -> int:
    """`lmperf amp all`: every experiment, one report."""
    from lmperf.amp.report import run_all
    from lmperf.results.store import append_record, ensure_writable
    from lmperf.runtime.device import resolve_device

    device = resolve_device(args.device)
    ensure_writable(args.out)

    def done(outcome) -> None:
        append_record(args.out, outcome.record)
        status = "ok" if outcome.result is not None else f"FAILED: {outcome.record['message']}"
        print(f"{outcome.name:<11} {outcome.seconds:5.1f} s  {status}", file=sys.stderr)

    path, outcomes = run_all(device, args.report, done)
    failed = [o.name for o in outcomes if o.result is None]
    print(f"report: {path}" + (f" ({len(failed)} failed: {', '.join(failed)})" if failed else ""),
          file=sys.stderr)
    return 1 if failed else 0
