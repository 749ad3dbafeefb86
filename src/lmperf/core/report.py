"""Report: the one result type every question returns, and the only place results are rendered.

A Report holds numbers, never formatted strings: `frame` (the main table, one row per run or per
measured item), `tables` (name -> DataFrame), `findings` (sentences computed from measured values)
and `records` (the JSON records written). `render(fmt)` turns it into text, Markdown, LaTeX, CSV
or JSON; a question may pass a `display` function that lays the main table out for reading
(e.g. "mean ± std" columns) at render time only.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import pandas as pd

FORMATS: tuple[str, ...] = ("text", "markdown", "latex", "csv", "json")
DIGITS = 4  # significant digits of floats in rendered tables

# (report) -> (main table laid out for reading, caption, notes); text, Markdown and LaTeX only.
Display = Callable[["Report"], tuple[pd.DataFrame, str, list[str]]]


@dataclass
class Report:
    """What one command (or one API call) produced.

    Attributes:
        kind: the record kind ('bench', 'profile', 'memory', 'train', 'attention', 'amp', ...).
        frame: the main table (numeric columns, units in their names).
        tables: further tables by name, numeric too.
        findings: sentences computed from the measured values.
        records: the JSON records behind it (as written to the results file).
        title: a heading for rendered output.
        display: optional layout of `frame` for reading (see `Display`).
    """

    kind: str
    frame: pd.DataFrame = field(default_factory=pd.DataFrame)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)
    records: list[dict] = field(default_factory=list)
    title: str = ""
    display: Display | None = None

    def table(self, name: str) -> pd.DataFrame:
        """One of `tables` by name; KeyError lists the names there are."""
        if name not in self.tables:
            raise KeyError(f"no table {name!r}; tables: {', '.join(self.tables) or 'none'}")
        return self.tables[name]

    def render(self, fmt: str = "text") -> str:
        """The report as text, 'markdown', 'latex', 'csv' (the main table) or 'json' (records)."""
        if fmt not in FORMATS:
            raise ValueError(f"unknown format {fmt!r}; accepted: {', '.join(FORMATS)}")
        if fmt == "json":
            return json.dumps(self.records, indent=1, allow_nan=False) + "\n"
        if fmt == "csv":
            frame = self.frame if not self.frame.empty else _first(self.tables)
            return frame.to_csv(index=False)
        sections: list[tuple[str, pd.DataFrame, str, list[str]]] = []
        if not self.frame.empty:
            if self.display is not None:
                shown, caption, notes = self.display(self)
            else:
                shown, caption, notes = self.frame, "", []
            sections.append((self.title, shown, caption, notes))
        sections += [(name, df, "", []) for name, df in self.tables.items()]
        return _render_sections(sections, self.findings, fmt)

    def __str__(self) -> str:
        return self.render("text")

    def _repr_markdown_(self) -> str:  # notebooks
        return self.render("markdown")


def caption_axes(df: pd.DataFrame, axes: Sequence[tuple[str, str]]) -> tuple[list[tuple[str, str]], str]:
    """Split (column, title) axes into those that vary across the rows (kept as columns) and a
    caption naming the ones that hold one value ("batch 4, mode forward")."""
    constant = [(col, title) for col, title in axes if df[col].nunique(dropna=False) == 1]
    caption = ", ".join(f"{title} {df[col].iloc[0]}" for col, title in constant)
    return [a for a in axes if a not in constant], caption


def mean_std_columns(out: pd.DataFrame, df: pd.DataFrame, phases: Sequence[str]) -> None:
    """Add a "<phase> (ms)" column reading "mean ± std" to `out` for every phase whose
    `<phase>_ms_mean` / `<phase>_ms_std` columns in `df` hold a value (text for reading only)."""
    for phase in phases:
        mean, std = df[f"{phase}_ms_mean"], df[f"{phase}_ms_std"]
        if mean.notna().any():
            out[f"{phase} (ms)"] = ["-" if m is None or m != m else f"{m:.2f} ± {s:.2f}"
                                   for m, s in zip(mean, std)]


def numbered(labels: Sequence[str]) -> list[str]:
    """Labels made unique for reading: a label that occurs more than once gets " #1", " #2"..."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if labels.count(label) == 1 else f"{label} #{seen[label]}")
    return out


def status_notes(statuses: Sequence[str], messages: Sequence[object]) -> tuple[list[str], list[str]]:
    """(status column, notes) of a table whose failed rows carry a reason: a row that is not ok
    reads "oom [1]" and note "[1] oom: <message on one line>" is printed under the table (the
    record keeps the full, possibly multi-line, message)."""
    column, notes = [], []
    for status, message in zip(statuses, messages):
        if status == "ok":
            column.append("ok")
            continue
        notes.append(f"[{len(notes) + 1}] {status}: {' '.join(str(message).split())}")
        column.append(f"{status} [{len(notes)}]")
    return column, notes


def _first(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    return next(iter(tables.values())) if tables else pd.DataFrame()


def _fmt_float(value: float) -> str:
    """DIGITS significant digits; large numbers in full with thousands separators (13,312 rather
    than 1.331e+04), tiny ones in scientific notation."""
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return "-" if math.isnan(value) else str(value)
    if abs(value) >= 10**DIGITS:
        return f"{value:,.0f}"
    return f"{value:.{DIGITS}g}"


def is_share(column: object) -> bool:
    """Whether a column holds fractions of a whole (0..1): by convention its name is `share` or
    ends in `_share`. Tables keep the fraction; only rendering writes it as percent."""
    return isinstance(column, str) and (column == "share" or column.endswith("_share"))


def readable(df: pd.DataFrame) -> pd.DataFrame:
    """Floats to DIGITS significant digits (as strings) for text, Markdown and LaTeX; share
    columns (`is_share`) as percent with one decimal ("12.3%"), as findings write them."""
    out = df.copy()
    for col in out.columns:
        if is_share(col) and pd.api.types.is_float_dtype(out[col]):
            out[col] = ["-" if v != v else f"{100 * v:.1f}%" for v in out[col]]
        elif pd.api.types.is_float_dtype(out[col]):
            out[col] = [_fmt_float(v) for v in out[col]]
        elif out[col].dtype == object:
            out[col] = [_fmt_float(v) if isinstance(v, float) else ("-" if v is None else v)
                        for v in out[col]]
    return out


def _render_sections(sections: list[tuple[str, pd.DataFrame, str, list[str]]],
                     findings: list[str], fmt: str) -> str:
    parts = []
    for title, df, caption, notes in sections:
        if df.empty:
            continue
        shown = readable(df)
        if fmt == "markdown":
            body = shown.to_markdown(index=False)
            head = f"#### {title}\n\n" if title else ""
            tail = "".join(f"\n{line}" for line in ([caption] if caption else []) + notes)
            parts.append(f"{head}{body}\n{tail}")
        elif fmt == "latex":
            latex = shown.to_latex(index=False, escape=True,
                                   caption=(f"{title}. {caption}" if caption else title) or None)
            parts.append(latex.replace("±", r"$\pm$") + "".join(f"% {n}\n" for n in notes))
        else:
            head = f"{title}\n" if title else ""
            tail = "".join(f"{line}\n" for line in ([caption] if caption else []) + notes)
            parts.append(f"{head}{shown.to_string(index=False)}\n{tail}")
    if findings:
        if fmt == "latex":
            items = "".join(f"  \\item {_latex_escape(f)}\n" for f in findings)
            parts.append(f"\\begin{{itemize}}\n{items}\\end{{itemize}}\n")
        else:
            bullet = "- " if fmt == "markdown" else "* "
            parts.append("\n".join(bullet + f for f in findings) + "\n")
    return "\n".join(parts) if parts else "no records\n"


def _latex_escape(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("$", r"\$"),
                 ("#", r"\#"), ("_", r"\_"), ("{", r"\{"), ("}", r"\}")):
        text = text.replace(a, b)
    return text.replace("±", r"$\pm$")


def concat(reports: list[Report], fmt: str = "text") -> str:
    """Several reports rendered one after the other (JSON: one list of all their records)."""
    if fmt == "json":
        return json.dumps([r for rep in reports for r in rep.records], indent=1) + "\n"
    if fmt == "csv" and len(reports) == 1:
        return reports[0].render("csv")
    out = []
    for rep in reports:
        head = {"markdown": f"### {rep.kind}\n\n", "latex": f"% {rep.kind}\n",
                "csv": f"# {rep.kind}\n"}.get(fmt, f"== {rep.kind}\n")
        out.append(head + rep.render(fmt))
    return "\n".join(out)
