"""The command line: argparse tables built from the shared vocabulary -> the Python API.

Library errors (bad input, unwritable files) become one line on stderr and exit code 2; an
interrupted sweep exits 130 with every finished row kept. Each question (`lmperf.catalog`) registers its own
subcommand (`<package>.cli.add_parser`); this module only assembles them, plus `table`.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
from pathlib import Path
from typing import NoReturn

from lmperf import __version__
from lmperf.catalog import QUESTIONS
from lmperf.core.vocabulary import add_options, check_args, did_you_mean, renamed
from lmperf.errors import LmperfError


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2, with a "did you mean" for a
    mistyped flag or choice."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}{self._suggest(message)} (see --help)\n")

    def _suggest(self, message: str) -> str:
        """'; did you mean --size?' for an unknown flag (this parser's and its subcommands'
        flags) or an invalid choice (its choices), else ''."""
        if (m := re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)):
            return did_you_mean(m.group(1), re.findall(r"'([^']*)'", m.group(2)))
        if (m := re.match(r"unrecognized arguments: (.*)", message)):
            parsers = [self] + [p for a in self._actions
                                if isinstance(a, argparse._SubParsersAction)
                                for p in a.choices.values()]
            flags = [f for p in parsers for f in p._option_string_actions]
            for word in m.group(1).split():
                flag = word.split("=")[0]  # another command's flag is no hint for this one
                if word.startswith("--") and (hint := did_you_mean(flag, [f for f in flags
                                                                           if f != flag])):
                    return hint
        return ""


def _add_table(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("table", help="rebuild the tables of results files (any kind of record)",
                       description="Print the tables of one or more results files as text, "
                                   "Markdown, LaTeX, CSV or JSON; each kind of record found is "
                                   "rendered by its question.")
    p.add_argument("file", type=Path, nargs="+",
                   help="JSONL results file(s), or folders (their *.jsonl)")
    p.add_argument("--kind", help="only records of this kind (default: every kind found)")
    add_options(p, ("format",))  # --format, --json [FILE], --details
    p.set_defaults(func=cmd_table)


_ALL = object()


def build_parser(command: str | None | object = _ALL) -> argparse.ArgumentParser:
    """The `lmperf` argument parser: every subcommand in full, or (`command` given, as `main`
    does) only that one in full and the others by name and question, so that `lmperf --help`,
    `lmperf bench --help` and a bad flag answer without importing what other commands need."""
    import importlib

    parser = _Parser(prog="lmperf", description="A performance lab for training Transformer LMs.")
    parser.add_argument("--version", action="version", version=f"lmperf {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=_Parser)
    for question in QUESTIONS:
        if command is _ALL or command == question.command:
            importlib.import_module(question.cli).add_parser(sub)
        else:
            sub.add_parser(question.command, help=question.ask)
    _add_table(sub)
    return parser


def cmd_table(args: argparse.Namespace) -> int:
    """`lmperf table FILE...`: the Report of every kind of record in the files."""
    from lmperf.core.command import emit, emit_json
    from lmperf.core.kinds import build_reports
    from lmperf.core.report import Report, concat
    from lmperf.results.store import read_records, results_files

    records = [r for f in results_files(args.file) for r in read_records(f)]
    if args.kind:
        records = [r for r in records if r["kind"] == args.kind]
    if not records:
        what = f"{args.kind!r} records" if args.kind else "records"
        verb = "holds" if len(args.file) == 1 else "hold"
        raise LmperfError(f"{', '.join(map(str, args.file))} {verb} no {what}")
    reports = build_reports(records)
    if len(reports) == 1:
        emit(reports[0], args)
        return 0
    if args.json:  # every kind's records in one list, on stdout or into the file
        emit_json(Report(kind="mixed", records=records), args.json)
        if args.json == "-":
            return 0
    sys.stdout.write(concat(reports, args.format, args.details))
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `lmperf` command; returns the exit code."""
    # SIGTERM (Slurm, `timeout`) and SIGHUP (a closed terminal) stop lmperf as Ctrl-C does: the
    # running child is killed and every finished row kept, instead of leaving the child running.
    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), _interrupt)
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        command = next((a for a in argv if not a.startswith("-")), None)  # the subcommand
        if (why := renamed(command, argv)) is not None:
            print(f"lmperf {command}: error: {why}", file=sys.stderr)
            return 2
        args = build_parser(command).parse_args(argv)  # Ctrl-C here is exit 130 too
        check_args(args.command, args)  # bad values in one line, before torch is imported
        return args.func(args)
    except LmperfError as exc:
        print(f"lmperf: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("lmperf: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def run(argv: list[str] | None = None) -> NoReturn:
    """The `lmperf` program (the console script, `python -m lmperf`): `main`, then end the
    process with its exit code, skipping the interpreter's teardown (0.5 to 1.5 s with torch
    loaded, docs/speed.md "Time to answer"): every file is written and closed by then, and
    children have ended. atexit handlers do not run."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's --help, --version
        code = exc.code
    if code is None or isinstance(code, bool):
        code = int(bool(code))
    elif not isinstance(code, int):  # sys.exit("message"): printed, exit status 1
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`lmperf table ... | head`), a closed stream
            pass
    os._exit(code)


if __name__ == "__main__":
    run()
