"""Write docs/options.md from the CLI's own parser: every flag of every command, with its help and default.

Run it after changing a command's flags:

    .venv/bin/python scripts/gen_options.py            # rewrites docs/options.md
    .venv/bin/python scripts/gen_options.py --check    # exit 1 if docs/options.md is stale

`tests/test_options_doc.py` runs the check. The parser is `lmperf.cli.build_parser()` with every
command built in full, so what is written here is what `lmperf COMMAND --help` shows; hidden
flags (`help=argparse.SUPPRESS`) are left out, as `--help` leaves them out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "options.md"

HEADER = """\
# Every option of every command

Generated from lmperf's own argument parser by `scripts/gen_options.py`; do not edit by hand
(`tests/test_options_doc.py` fails when this page and the parser disagree). Each command's
prose page is in [commands/](commands/); the options that mean the same thing in every
command are explained once in [concepts.md](concepts.md#one-vocabulary).
"""


def _cell(text: str) -> str:
    """Text made safe for one Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _subparsers(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    """(name, parser) of each subcommand of `parser`, in the order they were added."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:  # aliases share one parser
                    seen.add(id(sub))
                    out.append((name, sub))
    return out


def _flag(action: argparse.Action) -> str:
    """How the option is written: `--size SIZE [...]`, `--estimate`, or a positional's name."""
    if not action.option_strings:
        name = action.metavar or action.dest
        return f"`{name}`" + (" (several)" if action.nargs in ("+", "*") else "")
    names = ", ".join(action.option_strings)
    if action.nargs == 0:
        return f"`{names}`"
    metavar = action.metavar or (action.dest.upper() if not action.choices else None)
    if isinstance(metavar, tuple):  # one name per value already: `--diff A B`
        return f"`{names} {' '.join(metavar)}`"
    arg = metavar or "VALUE"
    if action.nargs in ("+", "*"):
        arg = f"{arg} [...]"
    elif action.nargs == "?":
        arg = f"[{arg}]"
    elif isinstance(action.nargs, int) and action.nargs > 1:
        arg = " ".join([arg] * action.nargs)
    return f"`{names} {arg}`"


def _default(action: argparse.Action) -> str:
    if action.nargs == 0:  # store_true / store_false / count
        return "off" if action.default in (False, None, 0) else "on"
    if action.default is None or action.default is argparse.SUPPRESS:
        return "-"
    d = action.default
    if isinstance(d, (list, tuple)):
        return " ".join(str(x) for x in d) or "-"
    return str(d)


def _rows(parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if action.help is argparse.SUPPRESS or isinstance(
                action, (argparse._HelpAction, argparse._VersionAction,
                         argparse._SubParsersAction)):
            continue
        helptext = formatter._expand_help(action) if action.help else ""
        choices = ""
        if action.choices and not isinstance(action, argparse._SubParsersAction):
            choices = ", ".join(str(c) for c in action.choices)
        rows.append(f"| {_cell(_flag(action))} | {_cell(choices) or '-'} | "
                    f"{_cell(_default(action))} | {_cell(helptext) or '-'} |")
    return rows


def _section(path: str, parser: argparse.ArgumentParser, out: list[str]) -> None:
    rows = _rows(parser)
    subs = _subparsers(parser)
    out.append(f"## `lmperf {path}`\n")
    if parser.description:
        out.append(_cell(parser.description) + "\n")
    if subs:
        out.append("Subcommands: " + ", ".join(f"`{n}`" for n, _ in subs) + " (each below).\n")
    if rows:
        out.append("| option | values | default | help |")
        out.append("| --- | --- | --- | --- |")
        out.extend(rows)
        out.append("")
    for name, sub in subs:
        _section(f"{path} {name}", sub, out)


def generate() -> str:
    """The text of docs/options.md for the parser as it is now."""
    sys.path.insert(0, str(ROOT / "src"))
    from lmperf.cli import build_parser

    parser = build_parser()
    commands = _subparsers(parser)
    out = [HEADER, "Commands: " + ", ".join(f"[`{n}`](#lmperf-{n})" for n, _ in commands) + ".\n"]
    for name, sub in commands:
        _section(name, sub, out)
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="do not write; exit 1 if docs/options.md differs from the parser")
    args = ap.parse_args(argv)
    text = generate()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is stale: run `python scripts/gen_options.py`",
                  file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
