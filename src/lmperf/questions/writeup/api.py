"""`lmperf.report(files, out=...)`: results files of any kinds -> one write-up (a self-contained
HTML page, or Markdown with PNGs next to it); returns the path written."""

from __future__ import annotations

import datetime as _dt
from collections import Counter
from pathlib import Path
from typing import Sequence

from lmperf.catalog import BY_COMMAND, BY_KIND
from lmperf.catalog import QUESTIONS as ASKED
from lmperf.errors import LmperfError, SpecError
from lmperf.questions.writeup.sections import Section, build_section
from lmperf.validate import choice

FORMATS: tuple[str, ...] = ("html", "markdown")
DEFAULT_OUT: dict[str, Path] = {"html": Path("results") / "report.html",
                                "markdown": Path("results") / "report.md"}
# The question each kind of record answers: the sections' headings, from the one table of
# questions (every kind has one; compare's rows are read from `lmperf compare --json FILE`).
QUESTIONS: dict[str, str] = {**{kind: q.ask for kind, q in BY_KIND.items()},
                             "compare": BY_COMMAND["compare"].ask}


def _read(files: Sequence[str | Path]) -> tuple[list[dict], list[dict],
                                                list[tuple[str, dict[str, int]]]]:
    """(all records of `files` in order, `lmperf compare --json` rows, (file, items per kind)
    for the page's header). A file is JSON lines or one JSON array (any command's --json FILE)."""
    from lmperf.results.store import is_json_array, read_json_array, read_records, read_text

    records, compared, inputs = [], [], []
    for f in files:
        text = read_text(Path(f))
        items = read_json_array(Path(f), text) if is_json_array(text) else None
        if items and all(i.get("kind") == "compare" and "table" in i for i in items):
            compared += items  # a comparison's rows: not runs, no envelope of their own
            mine = items
        else:
            mine = read_records(Path(f))
            records += mine
        inputs.append((str(f), dict(Counter(r["kind"] for r in mine))))
    return records, compared, inputs


def build_sections(records: list[dict]) -> list[Section]:
    """One `sections.Section` per kind of record and basis (measured, estimated, predicted:
    never one section for both), in the order of the questions (`catalog.QUESTIONS`: bench
    first, whatever the files' names), each kind's measurements before its estimates and
    predictions; plots drawn."""
    from lmperf.core.kinds import build_reports
    from lmperf.questions.writeup.plots import plots_for
    from lmperf.questions.writeup.sections import basis

    groups: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        groups.setdefault((r["kind"], basis(r)), []).append(r)
    order = list(dict.fromkeys(k for q in ASKED for k in (q.kind, *dict(q.more_kinds))))
    bases = ("measured", "estimated", "predicted")
    sections: list[Section] = []
    for (kind, how), mine in sorted(groups.items(), key=lambda g: (
            order.index(g[0][0]) if g[0][0] in order else len(order), bases.index(g[0][1]))):
        for rep in build_reports(mine):
            section = build_section(rep, how)
            section.plots = plots_for(rep)
            section.anchor = kind if all(s.kind != kind for s in sections) else f"{kind}-{how}"
            sections.append(section)
    return sections


def report(files: Sequence[str | Path] | str | Path, *, out: str | Path | None = None,
           format: str = "html", title: str | None = None) -> Path:
    """Write the write-up of the results files `files` (JSONL, any mix of kinds; what each
    section holds: docs/commands/report.md) and return its path: one self-contained HTML page,
    or (`format` "markdown") a .md file with its plots as PNG files next to it. `out` defaults
    to results/report.html (results/report.md); an existing file there is replaced. Raises
    SpecError for an unknown format, ResultsFileError for a missing or corrupt results file,
    LmperfError when the files hold no record or the report cannot be written.
    """
    from lmperf import __version__

    choice("report format", format, FORMATS)
    files = [files] if isinstance(files, (str, Path)) else list(files)
    if not files:
        raise SpecError("no results file given")
    records, compared, inputs = _read(files)
    if not records and not compared:
        raise LmperfError(f"{', '.join(map(str, files))} hold{'s' * (len(files) == 1)} no "
                          "records")
    path = Path(out) if out is not None else DEFAULT_OUT[format]
    if path.is_dir():
        raise LmperfError(f"cannot write the report to {path}: it is a directory")
    sections = build_sections(records)
    if compared:
        from lmperf.questions.writeup.compared import compare_section

        sections.append(compare_section(compared))
    generated = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    title = title or "lmperf report"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if format == "html":
            from lmperf.questions.writeup.html import page_html

            path.write_text(page_html(title, sections, QUESTIONS, inputs, generated, __version__),
                            encoding="utf-8")
        else:
            from lmperf.questions.writeup.markdown import page_md

            page_md(path, title, sections, QUESTIONS, inputs, generated, __version__)
    except OSError as exc:
        raise LmperfError(f"cannot write the report to {path}: {exc.strerror or exc}") from None
    return path
