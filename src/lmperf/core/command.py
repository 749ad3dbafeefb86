"""What every command does around its question: launch options, progress, printing a Report
(tables, --json, --format), the closing line, and Ctrl-C. The CLI handlers stay a few lines."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from lmperf.errors import LmperfError
from lmperf.results.schema import STATUSES

if TYPE_CHECKING:  # pandas and the launcher load when a command runs, not for --help
    from lmperf.core.report import Report
    from lmperf.core.sweep import SweepOptions


def sweep_options(*, inline: bool = False, timeout: float | None = None,
                  max_memory_gib: float | None = None, resume: bool = False,
                  progress: bool = False) -> SweepOptions:
    """SweepOptions from the launcher's keywords (checked), with a progress bar if asked for."""
    from lmperf.core.sweep import SweepOptions
    from lmperf.errors import SpecError

    for name, value in (("timeout", timeout), ("max_memory_gib", max_memory_gib)):
        if value is not None and not (math.isfinite(value) and value > 0):  # NaN, inf too
            raise SpecError(f"--{name.replace('_', '-')} must be a positive number, "
                            f"got {value:g}")
    options = SweepOptions(isolate=not inline, timeout_s=timeout, max_memory_gib=max_memory_gib,
                           resume=resume)
    if options.isolate and options.warm:
        from lmperf.core.launch import ForkServer

        ForkServer.get()  # starts importing torch now, while the caller plans its jobs
    if progress:
        from lmperf.core.progress import RichReporter

        options.reporter = RichReporter()
    return options


def launch_kwargs(args: argparse.Namespace) -> dict:
    """The launcher's options of a parsed command line, as API keywords."""
    return {name: getattr(args, name) for name in ("inline", "timeout", "max_memory_gib", "resume")
            if hasattr(args, name)}


def err(line: str) -> None:
    """One line on stderr (notes, progress stages, the closing line), wrapped to WIDTH."""
    from lmperf.core.report import wrap  # pandas: loaded by every command that gets here

    print(wrap(line, "", "  "), file=sys.stderr, flush=True)


def check_out(path: Path) -> None:
    """Refuse an --out that cannot take records, before anything runs, creating nothing: an
    existing file must be lmperf JSON lines, a new one's first existing folder writable.
    Raises ResultsFileError."""
    import os

    from lmperf.errors import ResultsFileError
    from lmperf.results.store import ensure_writable

    folder = next(p for p in (path, *path.parents) if p.exists())
    if folder == path:
        return ensure_writable(path)  # an existing file: read and opened, nothing created
    if not (folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)):
        raise ResultsFileError(f"cannot write results to {path}: {folder} is not a writable folder")


def emit_json(report: Report, target: str) -> None:
    """The report's records as JSON: on stdout for "-", else into the file `target`."""
    if target == "-":
        sys.stdout.write(report.render("json"))
        return
    try:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(report.render("json"), encoding="utf-8")
    except OSError as exc:
        raise LmperfError(f"cannot write JSON to {target}: {exc.strerror or exc}") from None
    err(f"records written as JSON to {target}")


def emit(report: Report, args: argparse.Namespace) -> None:
    """Print the report as asked: `--json` (records on stdout and nothing else, or into a file)
    and/or the tables in `--format` (text: the brief, or every table with `--details`)."""
    target = getattr(args, "json", None)
    if target:
        emit_json(report, target)
        if target == "-":
            return
    sys.stdout.write(report.render(getattr(args, "format", "text"),
                                   getattr(args, "details", False)))


def closing_line(report: Report, out: Path | None, noun: str = "run",
                 appended: int | None = None) -> str:
    """'N run(s): a ok, b oom; records appended to FILE', or after --resume 'N run(s): ...
    (2 done before); 4 records appended to FILE' (`appended`: lines the run added to FILE)."""
    if not report.records:
        return (f"nothing to run: every job is already ok in {out}" if out else "nothing ran")
    counts = {s: sum(r["status"] == s for r in report.records) for s in STATUSES}
    before = len(report.records) - appended if appended is not None else 0
    where = ("" if not out else f"; records appended to {out}" if not before else
             f" ({before} done before); {appended} record{'s' * (appended != 1)} appended to {out}")
    return (f"{len(report.records)} {noun}(s): "
            + ", ".join(f"{n} {s}" for s, n in counts.items() if n) + where)


def _lines(path: object) -> int | None:
    """Lines in a results file now (0 when there is none yet; None: no file asked for)."""
    if not isinstance(path, (str, Path)):
        return None
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def run_command(args: argparse.Namespace, produce: Callable[[], Report], noun: str = "run") -> int:
    """Run `produce` (the API call), print its Report, and return the exit code: 0 when it ran
    (failed rows are results), 130 after Ctrl-C with every finished row kept."""
    from lmperf.core.sweep import SweepInterrupted

    out = getattr(args, "out", None)
    before = _lines(out)
    try:
        report = produce()
    except SweepInterrupted as stop:
        saved = f" are saved in {stop.out}" if stop.out else " were kept"
        err(f"interrupted: {len(stop.records)} finished record(s){saved}; run the same command "
            "with --resume to finish the rest")
        return 130
    emit(report, args)
    if getattr(args, "json", None) != "-":
        after = _lines(out)
        err(closing_line(report, out, noun, None if before is None else after - before))
    return 0
