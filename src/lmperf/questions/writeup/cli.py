"""`lmperf report RESULTS... -o FILE`: the flags -> `lmperf.questions.writeup.api.report` -> the file."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `lmperf report`."""
    p = sub.add_parser("report", help="write up results files as one HTML page (or Markdown)",
                       description="Turn results files of any kinds (bench, profile, memory, "
                                   "train, attention, amp) into one write-up: for each kind its "
                                   "tables, findings, plots, failed runs with their reason, "
                                   "warnings and the environment of the runs. The HTML page is "
                                   "self-contained (styles inline, plots embedded, nothing "
                                   "fetched); --format markdown writes a .md file and its plots "
                                   "as PNG files next to it.")
    p.add_argument("file", type=Path, nargs="+", metavar="RESULTS",
                   help="JSONL results file(s), or folders (their *.jsonl, e.g. results/)")
    p.add_argument("-o", "--out", type=Path, default=None, metavar="FILE", dest="output",
                   help="where to write the report, replaced if it exists (default: "
                        "results/report.html, or results/report.md with --format markdown)")
    p.add_argument("--format", default="html", choices=["html", "markdown"],
                   help="html: one self-contained page (default); markdown: .md + PNG files")
    p.add_argument("--title", default=None, help="the page's title (default: lmperf report)")
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    """`lmperf report`: write the page, say where it is."""
    from lmperf.core.command import err
    from lmperf.questions.writeup.api import report
    from lmperf.results.store import results_files

    existed = args.output is not None and args.output.is_file()
    path = report(results_files(args.file), out=args.output, format=args.format, title=args.title)
    size = path.stat().st_size
    err(f"report written to {path} ({size / 1024:,.0f} KiB"
        + ("; replaced the previous file" if existed else "") + ")")
    return 0
