"""The command line: a table of subcommands -> typed library functions.

Library errors (bad input, unwritable files) become one line on stderr and exit code 2; an
interrupted sweep exits 130 with every finished row kept.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lmperf import __version__
from lmperf.errors import LmperfError, SpecError

DEFAULT_OUT = Path("results") / "bench.jsonl"
CPU_DEFAULTS = {"sizes": ["tiny", "mini"], "contexts": [128], "precisions": ["fp32", "bf16-mixed"]}
CUDA_DEFAULTS = {"sizes": ["small", "medium", "large", "xl", "2.7B"],
                 "contexts": [128, 256, 512, 1024], "precisions": ["fp32"]}


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def add_spec_arguments(p: argparse.ArgumentParser, sweep: bool, warmup: int = 5) -> None:
    """The flags that make a RunSpec; with `sweep`, the axes take lists (cartesian product)."""
    from lmperf.bench.spec import MODES
    from lmperf.model import ATTENTION, PRESETS
    from lmperf.runtime.precision import REGIMES

    many = {"nargs": "+"} if sweep else {}
    s = "(s)" if sweep else ""
    p.add_argument("--size", metavar="SIZE", **many,
                   help=f"model size preset{s}: {', '.join(PRESETS)} "
                        + ("(default: tiny mini on CPU; the course's five sizes on CUDA)" if sweep
                           else "(default: mini on CPU, small on CUDA)"))
    p.add_argument("--model", metavar="PKG.MOD:FACTORY",
                   help="your own model: a factory taking lmperf.model.ModelConfig and returning an "
                        "nn.Module mapping token ids (B, T) to logits (B, T, vocab)")
    p.add_argument("--context", type=int, metavar="T", **many,
                   help=f"sequence length{s} " + ("(default: 128 on CPU; 128 256 512 1024 on CUDA)"
                                                  if sweep else "(default: 128)"))
    p.add_argument("--model-context", type=int, default=0, metavar="T",
                   help="the model's maximum context length (default: the run's --context)")
    p.add_argument("--batch", type=int, metavar="B", **many, default=[4] if sweep else 4,
                   help=f"batch size{s} (default: 4)")
    p.add_argument("--precision", metavar="REGIME", **many,
                   help=f"precision regime{s}: {', '.join(REGIMES)} "
                        + ("(default: fp32 bf16-mixed on CPU; fp32 on CUDA)" if sweep else "(default: fp32)"))
    p.add_argument("--mode", metavar="MODE", **many, default=["train-step"] if sweep else "train-step",
                   help=f"what a step does: {', '.join(MODES)} (default: train-step)")
    p.add_argument("--attention", metavar="IMPL", **many, default=["naive"] if sweep else "naive",
                   help=f"attention implementation{s}: {', '.join(ATTENTION)} (default: naive)")
    p.add_argument("--optimizer", default="auto", choices=["auto", "fused", "foreach", "loop"],
                   help="AdamW implementation (default: auto, the fastest this device supports)")
    p.add_argument("--warmup", type=int, default=warmup, help=f"untimed warm-up steps (default: {warmup})")
    p.add_argument("--steps", type=int, default=10, help="timed steps (default: 10)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and batch (default: 0)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="(default: auto)")


def _add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="time forward, backward and optimizer steps; sweep over lists",
                       description="Benchmark the reference LM (or your own) and append one JSON "
                                   "record per run to a results file. Every option that takes a "
                                   "list sweeps over the cartesian product.")
    add_spec_arguments(p, sweep=True)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help=f"JSONL results file, appended to (default: {DEFAULT_OUT})")
    p.add_argument("--resume", action="store_true", help="skip runs already 'ok' in --out")
    p.add_argument("--inline", action="store_true",
                   help="run in this process instead of one child process per run (debugging)")
    p.add_argument("--timeout", type=float, metavar="S", help="kill a run after S seconds (an error row)")
    p.add_argument("--max-memory-gib", type=float, metavar="G",
                   help="cap each run's memory so it hits a clean OOM row (CPU: address space incl. "
                        "~0.6 GiB for Python+torch; CUDA: allocator limit)")
    p.add_argument("--format", default="text", choices=["text", "markdown", "latex", "csv"],
                   help="format of the table printed at the end (default: text)")
    p.set_defaults(func=cmd_bench)


def _add_table(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("table", help="rebuild the table from a results file",
                       description="Print the table of a results file as text, Markdown, LaTeX or CSV.")
    p.add_argument("file", type=Path, help="a JSONL results file")
    p.add_argument("--format", default="text", choices=["text", "markdown", "latex", "csv"])
    p.add_argument("--kind", default="bench", help="which records to show (default: bench)")
    p.set_defaults(func=cmd_table)


def build_parser() -> argparse.ArgumentParser:
    """The `lmperf` argument parser."""
    parser = _Parser(prog="lmperf", description="A performance lab for training Transformer LMs.")
    parser.add_argument("--version", action="version", version=f"lmperf {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=_Parser)
    _add_bench(sub)
    _add_table(sub)
    from lmperf.profile.cli import add_parser as add_profile
    from lmperf.attnbench.cli import add_parser as add_attention
    from lmperf.memory.cli import add_parser as add_memory
    from lmperf.train.cli import add_parser as add_train

    add_profile(sub)
    add_train(sub)
    add_memory(sub)
    add_attention(sub)
    from lmperf.amp.cli import add_parser as add_amp

    add_amp(sub, _Parser)
    return parser


def _positive_opt(name: str, value: float | None) -> None:
    if value is not None and value <= 0:
        raise SpecError(f"{name} must be positive, got {value:g}")


def cmd_bench(args: argparse.Namespace) -> int:
    """`lmperf bench`: expand the grid, check it, run the sweep, print the table."""
    from lmperf.bench.plan import plan_bench
    from lmperf.bench.sweep import SweepInterrupted, SweepOptions, run_sweep
    from lmperf.progress import RichReporter, print_table
    from lmperf.results.tables import render
    from rich.console import Console

    _positive_opt("--timeout", args.timeout)
    _positive_opt("--max-memory-gib", args.max_memory_gib)
    err = Console(stderr=True, soft_wrap=True)
    plan = plan_bench(args, CPU_DEFAULTS, CUDA_DEFAULTS)
    for note in plan.notes:
        err.print(f"note: {note}", highlight=False)
    for warning in plan.warnings:
        err.print(f"[yellow]warning:[/] {warning}", highlight=False)
    options = SweepOptions(isolate=not args.inline, timeout_s=args.timeout,
                           max_memory_gib=args.max_memory_gib, resume=args.resume,
                           reporter=RichReporter(err))
    try:
        records = run_sweep(plan.specs, args.out, options)
    except SweepInterrupted as stop:
        err.print(f"interrupted: {len(stop.records)} finished run(s) are saved in {stop.out}; "
                  "run the same command with --resume to finish the rest", highlight=False)
        return 130
    if not records:
        err.print(f"nothing to run: all {len(plan.specs)} run(s) are already ok in {args.out}",
                  highlight=False)
        return 0
    if args.format == "text":
        print_table(records, title=f"lmperf bench on {plan.device_name} (times: mean ± std over "
                                  f"{plan.specs[0].steps} steps)")
    else:
        sys.stdout.write(render(records, args.format))
    counts = {s: sum(r["status"] == s for r in records) for s in ("ok", "oom", "error", "unsupported")}
    err.print(f"{len(records)} run(s): " + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
              + f"; records appended to {args.out}", highlight=False)
    return 0


def cmd_table(args: argparse.Namespace) -> int:
    """`lmperf table FILE`: render the records of a results file."""
    from lmperf.progress import print_table
    from lmperf.results.store import read_records
    from lmperf.results.tables import render

    records = [r for r in read_records(args.file) if r["kind"] == args.kind]
    if not records:
        raise LmperfError(f"{args.file} holds no {args.kind!r} records")
    if args.kind == "train":
        from lmperf.train.report import render_summary

        fmt = "markdown" if args.format == "markdown" else "text"
        sys.stdout.write(render_summary(records, fmt))
    elif args.kind == "attention":
        from lmperf.attnbench.report import render as render_attention

        sys.stdout.write(render_attention(records, "markdown" if args.format == "markdown" else "text"))
    elif args.kind != "bench":  # amp, profile, memory: the tables each record carries
        sys.stdout.write(_render_stored_tables(records, "markdown" if args.format == "markdown" else "text"))
    elif args.format == "text":
        print_table(records)
    else:
        sys.stdout.write(render(records, args.format))
    return 0


def _render_stored_tables(records: list[dict], fmt: str) -> str:
    """Records that carry their own tables (metrics.tables: title -> rows) and findings."""
    import pandas as pd

    from lmperf.results.tables import render_sections

    parts = []
    for r in records:
        metrics = r.get("metrics") or {}
        name = r["spec"].get("experiment") or r["spec"].get("size") or r["kind"]
        tables = [(t, pd.DataFrame(rows)) for t, rows in (metrics.get("tables") or {}).items()]
        parts.append(f"== {r['kind']} {name} ({r['status']}) {r['env'].get('timestamp', '')}\n"
                     + render_sections(tables, metrics.get("notes") or [], fmt))
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `lmperf` command; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except LmperfError as exc:
        print(f"lmperf: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("lmperf: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
