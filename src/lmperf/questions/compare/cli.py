"""`lmperf compare`: two results files (or two groups of one) -> `lmperf.compare` -> Report, and
an exit code that can guard a CI job (`--fail-above`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from lmperf.questions.compare.records import MAX_LOAD
from lmperf.core.vocabulary import add_options
from lmperf.measure.compare import INCONCLUSIVE, LEVEL, MIN_EFFECT, RESAMPLES

EXIT_SLOWER = 1  # --fail-above: some phase is significantly slower by more than P%, or none compared


HELP = "is NEW faster than BASE? ratio of medians per phase, with a CI"
# `lmperf compare --help` (one paragraph; line breaks here are not kept)
DESCRIPTION = " ".join("""
Match the records of two results files (or two groups of one file, --by) by spec and compare
every timed phase: the ratio of medians NEW/BASE with a bootstrap confidence interval, marked
slower / faster / no significant change; plus tokens/s and peak memory. Specs found on one side
only are listed. Exit codes: 0 compared, 1 --fail-above tripped (a phase slower, or nothing
compared), 2 bad input.
""".split())


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `lmperf compare`."""
    p = sub.add_parser("compare", help=HELP, description=DESCRIPTION)
    p.add_argument("files", type=Path, nargs="+", metavar="FILE",
                   help="BASE NEW (two JSONL results files or folders of them), or one with --by")
    p.add_argument("--by", nargs="+", metavar="FIELD [A B]",
                   help="compare the records whose spec FIELD is B (NEW) with those where it is "
                        "A (BASE), e.g. --by precision fp32 bf16-mixed ('none' for no user "
                        "model); FIELD alone: the file's two values of it, first run first (an "
                        "A/B sweep: lmperf bench --model reference mine:f --rounds 5)")
    p.add_argument("--ignore", nargs="+", default=[], metavar="FIELD",
                   help="spec fields that need not match (e.g. model steps)")
    p.add_argument("--kind", help="only records of this kind (default: every kind found)")
    p.add_argument("--confidence", type=float, default=LEVEL, metavar="C",
                   help=f"level of the confidence intervals (default: {LEVEL})")
    p.add_argument("--min-effect", type=float, default=MIN_EFFECT * 100, metavar="PCT",
                   help="smallest change in percent called slower or faster, on top of the "
                        f"interval excluding 1 (default: {MIN_EFFECT * 100:g})")
    p.add_argument("--max-load", type=float, default=MAX_LOAD, metavar="L",
                   help="a change seen when a CPU run started with a 1-minute load average above "
                        "L per CPU is 'inconclusive', not slower/faster; 'inf' turns this off "
                        f"(default: {MAX_LOAD:g})")
    p.add_argument("--fail-above", type=float, default=None, metavar="PCT",
                   help=f"exit with code {EXIT_SLOWER} when a phase is 'slower' by more than PCT "
                        "percent, or when nothing was compared (for CI jobs)")
    p.add_argument("--resamples", type=int, default=RESAMPLES, metavar="N",
                   help=f"bootstrap resamples per phase (default: {RESAMPLES})")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap (default: 0)")
    add_options(p, ("format",))
    p.set_defaults(func=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    """`lmperf compare`: print the comparison; exit 1 if --fail-above finds a slower phase."""
    from lmperf.questions.compare.api import compare
    from lmperf.questions.compare.report import failing, spec_columns, spec_label
    from lmperf.questions.compare.rows import judged_change
    from lmperf.core.command import emit, err
    from lmperf.errors import SpecError

    if len(args.files) > 2:
        raise SpecError(f"compare takes BASE NEW, or one file with --by; got {len(args.files)} "
                        "files")
    if args.fail_above is not None and args.fail_above < 0:
        raise SpecError(f"--fail-above must be a non-negative percentage, got {args.fail_above:g}")
    sides = [_side(f) for f in args.files]
    report = compare(sides[0], sides[1] if len(sides) == 2 else None, by=args.by, ignore=args.ignore, kind=args.kind,
                     confidence=args.confidence, min_effect=args.min_effect,
                     max_load=args.max_load,
                     resamples=args.resamples, seed=args.seed)
    emit(report, args)
    if args.fail_above is None:
        return 0
    if report.frame.empty:  # a guard that compared nothing must not pass
        err(f"--fail-above {args.fail_above:g}: nothing compared (no spec ran ok on both sides); "
            f"exit code {EXIT_SLOWER}")
        return EXIT_SLOWER
    bad = failing(report.frame, args.fail_above)
    columns = [c for c in spec_columns(report.frame) if report.frame[c].nunique(dropna=False) > 1]
    for _, row in bad.iterrows():
        change, ratio, low, high = judged_change(row)
        err(f"slower: {row['phase']} of {spec_label(row, columns) or row['record_kind']}: "
            f"{change:+.1f}% (ratio {ratio:.3f} [{low:.3f}, {high:.3f}], {row['judged_on']})")
    unsure = int((report.frame["verdict"] == INCONCLUSIVE).sum()) if len(report.frame) else 0
    if unsure:
        err(f"warning: {unsure} phase(s) inconclusive (machine loaded): not counted by "
            "--fail-above")
    if len(bad):
        err(f"--fail-above {args.fail_above:g}: {len(bad)} phase(s) slower by more than "
            f"{args.fail_above:g}%; exit code {EXIT_SLOWER}")
        return EXIT_SLOWER
    err(f"--fail-above {args.fail_above:g}: no phase is slower by more than {args.fail_above:g}%")
    return 0


def _side(path: Path) -> Path | list[dict]:
    """One side of the comparison: a results file, or a folder's *.jsonl records together."""
    from lmperf.results.store import read_records, results_files

    files = results_files([path])
    return files[0] if not path.is_dir() else [r for f in files for r in read_records(f)]
