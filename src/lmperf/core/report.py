"""Report: the one result type every question returns, and the only place results are rendered.

A Report holds numbers, never formatted strings: `frame` (the main table, one row per run or per
measured item), `tables` (name -> DataFrame), `findings` (sentences computed from measured values)
and `records` (the JSON records written). `render(fmt)` turns it into text, Markdown, LaTeX, CSV
or JSON; a question may pass a `display` function that lays the main table out for reading
(e.g. "mean ± std" columns) at render time only.

Human formats (text, Markdown, LaTeX) follow one style: headers read as words with their unit
(`cpu_range_ms` -> "cpu range (ms)"), shares as percent, bytes in KiB / MiB / GiB (columns named
`bytes`, `*_bytes`, `*_mib`, `*_gib`), no scientific notation; text also fits WIDTH columns
(the widest text cells cut with "…", one line per row), findings and notes wrapped as footnotes
(a `code span`, a command to copy, never broken). Every human format opens with the report's
`headline`: the answer in a few lines, with the numbers that matter. A report's `brief` keeps
text to a screen: per table the columns and rows shown there (None: that table only with
--details and in the full formats). CSV and JSON keep the raw numbers.
"""

from __future__ import annotations

import json
import math
import re
import textwrap
from dataclasses import dataclass, field
from typing import Callable, Sequence

import pandas as pd
from lmperf.units import GIB, MIB

FORMATS: tuple[str, ...] = ("text", "markdown", "latex", "csv", "json")
DIGITS = 4  # significant digits of floats in rendered tables
WIDTH = 120  # columns of a text rendering and of a line on stderr (a terminal, a screen)
FULL = "--format markdown or csv, or `lmperf report`"  # where a text table's cut cells are
DETAILS = f"--details, {FULL}"  # where the tables and columns a brief text leaves out are

# (report) -> (main table laid out for reading, caption, notes); text, Markdown and LaTeX only.
Display = Callable[["Report"], tuple[pd.DataFrame, str, list[str]]]


@dataclass
class Report:
    """What one command (or one API call) produced, of record `kind` (frame, tables, findings
    and records: the module docstring and docs/api.md). `display`: an optional layout of `frame`
    for reading; `brief` (text only): table name -> (columns, rows) to show (None for either:
    all; rows 0: the table only with --details), or None to leave the table to --details and
    the full formats; `headline`: the answer in at most 4 lines, numbers included, printed
    first; `more`: findings for --details and the full formats only (methods, costs);
    `answer`: the columns (as a table shows them) that hold the answer, the last a text table
    too wide for WIDTH drops."""

    kind: str
    frame: pd.DataFrame = field(default_factory=pd.DataFrame)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)
    records: list[dict] = field(default_factory=list)
    title: str = ""
    display: Display | None = None
    brief: dict[str, tuple[Sequence[str] | None, int | None] | None] = field(default_factory=dict)
    headline: list[str] = field(default_factory=list)
    more: list[str] = field(default_factory=list)
    answer: Sequence[str] = ()

    def table(self, name: str) -> pd.DataFrame:
        """One of `tables` by name; KeyError lists the names there are."""
        if name not in self.tables:
            raise KeyError(f"no table {name!r}; tables: {', '.join(self.tables) or 'none'}")
        return self.tables[name]

    def main(self) -> tuple[pd.DataFrame, str, list[str]]:
        """(the main table as read, its caption, its notes): `display`'s layout, else `frame`."""
        return self.display(self) if self.display is not None else (self.frame, "", [])

    def render(self, fmt: str = "text", details: bool = False) -> str:
        """The report as text, 'markdown', 'latex', 'csv' (the main table) or 'json' (records).
        Text keeps to `brief` unless `details` (every table, every row)."""
        if fmt not in FORMATS:
            raise ValueError(f"unknown format {fmt!r}; accepted: {', '.join(FORMATS)}")
        if fmt == "json":
            return json.dumps(self.records, indent=1, allow_nan=False) + "\n"
        if fmt == "csv":
            frame = self.frame if not self.frame.empty else _first(self.tables)
            return frame.to_csv(index=False)
        sections: list[tuple[str, pd.DataFrame, str, list[str]]] = []
        if not self.frame.empty:
            sections.append((self.title, *self.main()))
        # text: the brief tables (with --details every table and row, in the brief's columns)
        brief_text = fmt == "text" and not details
        brief = self.brief if fmt == "text" else {}
        hidden = []
        for name, df in self.tables.items():
            if name not in brief or brief[name] is None and details:
                sections.append((name, df, "", []))
            elif brief[name] is None or brief[name][1] == 0 and not details:
                hidden.append(re.split(r":| \(", name)[0])
            else:
                columns, rows = brief[name]  # type: ignore[misc]
                rows = None if details else rows
                more = [c for c in df.columns if columns is not None and c not in columns]
                shown = df[[c for c in (columns or df.columns) if c in df.columns]]
                names = f" ({', '.join(map(header, more))})" if len(str(more)) < 80 else ""
                notes = ([f"{len(df) - rows} more rows"] if rows is not None and len(df) > rows
                         else []) + ([f"{len(more)} more columns{names}"] if more else [])
                sections.append((name, shown.head(rows) if rows is not None else shown, "",
                                 ["; ".join(notes) + f": {FULL if details else DETAILS}"]
                                 if notes else []))
        findings = list(self.findings) + ([] if brief_text else self.more)
        left = ([f"{len(hidden)} more table(s) ({'; '.join(dict.fromkeys(hidden))})"] if hidden
                else []) + ([f"{len(self.more)} more finding(s)"] if brief_text and self.more
                            else [])
        if left:
            findings.append(f"{' and '.join(left)}: {DETAILS}")
        return _render_sections(self.headline, sections, findings, fmt, self.answer)

    def __str__(self) -> str:
        return self.render("text")

    def _repr_markdown_(self) -> str:  # notebooks
        return self.render("markdown")


def caption_axes(df: pd.DataFrame, axes: Sequence[tuple[str, str]], keep: Sequence[str] = ()
                 ) -> tuple[list[tuple[str, str]], str]:
    """Split (column, title) axes into those that vary across the rows (kept as columns, as are
    the columns `keep` always) and a caption naming the ones that hold one value ("batch 4,
    mode forward")."""
    constant = [(col, title) for col, title in axes
                if col not in keep and df[col].nunique(dropna=False) == 1]
    caption = ", ".join(f"{title} {df[col].iloc[0]}" for col, title in constant)
    return [a for a in axes if a not in constant], caption


def median_columns(out: pd.DataFrame, df: pd.DataFrame, phases: Sequence[str],
                   spread: str = "step") -> None:
    """Add to `out` the headline of a run: a "<phase> (ms)" column of medians (numbers) for every
    phase whose `<phase>_ms_median` in `df` holds a value, then "<spread> mean ± std (ms)" beside
    them (text for reading only)."""
    for phase in phases:
        if df[f"{phase}_ms_median"].notna().any():
            out[f"{phase} (ms)"] = df[f"{phase}_ms_median"].astype(float)
    mean, std = df[f"{spread}_ms_mean"], df[f"{spread}_ms_std"]
    if mean.notna().any():
        out[f"{spread} mean ± std"] = ["-" if m is None or m != m else f"{m:.2f} ± {s:.2f}"
                                      for m, s in zip(mean, std)]


def against(keys: Sequence[tuple], base: Sequence[bool]) -> list[int | None]:
    """The row each row is held against, by every ratio's one rule (the CLI's, `lmperf table`'s,
    the write-up's): the latest `base` row of the same setting (`keys`: every axis but the
    compared one) at or before it, i.e. its own sweep's, else the first after; None: none."""
    keys = [tuple(map(str, k)) for k in keys]  # NaN and None compare as written
    rows: dict[tuple, list[int]] = {}
    for i, (k, b) in enumerate(zip(keys, base)):
        if b:
            rows.setdefault(k, []).append(i)
    out: list[int | None] = []
    for i, k in enumerate(keys):
        found = rows.get(k, [])
        before = [j for j in found if j <= i]
        out.append(before[-1] if before else found[0] if found else None)
    return out


def plural(n: float, noun: str) -> str:
    """'1 call', '15 calls', '1.5 calls': a count and its noun, plural unless the count is 1."""
    return f"{n:,.4g} {noun}" + ("" if n == 1 else "s")


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
    """DIGITS significant digits in plain notation; from 1,000 up whole, with thousands
    separators (9,155 and 13,312, not 9155 beside 13,312 or 1.331e+04), tiny ones to 6
    decimals (2.2e-05 -> 0.000022; below that "0")."""
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return "-" if math.isnan(value) else str(value)
    if abs(value) >= 10 ** (DIGITS - 1):
        return f"{value:,.0f}"
    if value == 0:
        return "0"
    decimals = min(6, max(0, DIGITS - 1 - math.floor(math.log10(abs(value)))))
    text = f"{value:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


BYTE_SCALE = {"bytes": 1, "mib": MIB, "gib": GIB}
"""A column's unit suffix -> bytes per unit: such columns are shown in KiB / MiB / GiB."""


def human_bytes(value: float) -> str:
    """A byte count for reading: '512 B', '16 KiB', '338.7 MiB', '1.5 GiB' (powers of 1024)."""
    if value != value:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{_fmt_float(float(value))} {unit}"
        value /= 1024
    raise AssertionError  # unreachable


def _byte_scale(column: object) -> int | None:
    if not isinstance(column, str) or " " in column:
        return None
    return BYTE_SCALE.get(column if column == "bytes" else column.rsplit("_", 1)[-1])


_UNITS = {"ms": "ms", "s": "s", "us": "us", "gbps": "GB/s", "mb": "MB", "pct": "%",
          "share": "%", "gflop/s": "GFLOP/s", "gb/s": "GB/s"}
_STATS = {"mean", "std", "median", "iqr", "min", "max"}


def header(column: object) -> str:
    """A column's header for reading: a snake_case name as words with its unit in brackets
    (`benchmarked_ms_mean` -> "benchmarked (ms, mean)", `gpu_busy_share` -> "gpu busy (%)",
    `saved_bytes` -> "saved"); any other name as it is."""
    if not isinstance(column, str) or not re.fullmatch(r"[a-z][a-z0-9_]*_[a-z0-9_]+", column):
        return str(column)
    words = re.sub(r"_per_s(?=_|$)", "/s", column).split("_")
    if _byte_scale(column):
        words = words[:-1]
    if not is_share(column):
        words = [w + "_" if w == "share" else w for w in words]  # a ratio of shares: a word
    kept = [w for i, w in enumerate(words) if not i or (w not in _UNITS and w not in _STATS)]
    extra = [_UNITS[w] for w in words[1:] if w in _UNITS] + [w for w in words[1:] if w in _STATS]
    return " ".join(kept).replace("_", "") + (f" ({', '.join(dict.fromkeys(extra))})" if extra else "")


# A number on its own (not inside a word, an id or a hyphenated name: `abc-4e5`, `x1e-3`), with
# an exponent of at most two digits (a hash such as `1234e56` or 5e-300 is left as it is).
_SCIENTIFIC = re.compile(r"(?<![\w.+-])(?:[-+](?=\d))?\d+(?:\.\d+)?[eE][-+]?\d{1,2}(?![\w.])")


def plain_numbers(text: str) -> str:
    """`text` with every number in scientific notation written plainly (2.9e-06 -> 0.0000029,
    1.3e+04 -> 13,000), two significant digits at least."""
    def plain(match: re.Match) -> str:
        value = float(match.group())
        if value != 0 and not 1e-9 <= abs(value) < 1e15:  # plain would be longer than useful
            return match.group()
        if value == 0 or abs(value) >= 1:
            return _fmt_float(value)
        digits = max(2, len(match.group().split("e")[0].replace("-", "").replace(".", "")))
        return f"{value:.{digits - 1 - math.floor(math.log10(abs(value)))}f}"
    return _SCIENTIFIC.sub(plain, text)


def is_share(column: object) -> bool:
    """Whether a column holds fractions of a whole (0..1): by convention its name is `share` or
    ends in `_share`. Tables keep the fraction; only rendering writes it as percent."""
    return isinstance(column, str) and (column == "share" or column.endswith("_share"))


def readable(df: pd.DataFrame, shares: bool = False) -> pd.DataFrame:
    """The table as strings for text, Markdown and LaTeX: floats to DIGITS significant digits in
    plain notation; share columns (`is_share`) as percent with one decimal ("12.3%"), as
    findings write them; byte columns (`bytes`, `*_bytes`, `*_mib`, `*_gib`) in KiB / MiB / GiB.
    Column names are kept (the renderer writes them as `header`s). `shares`: every float column is a share (a
    table titled "share ...")."""
    out = df.copy()
    for col in out.columns:
        numeric = pd.api.types.is_numeric_dtype(out[col]) and not pd.api.types.is_bool_dtype(out[col])
        if (is_share(col) or shares and pd.api.types.is_float_dtype(out[col])) and numeric:
            out[col] = ["-" if v != v else f"{100 * v:.1f}%" for v in out[col].astype(float)]
        elif _byte_scale(col) and numeric:
            out[col] = [human_bytes(float(v) * _byte_scale(col)) for v in out[col].astype(float)]
        elif pd.api.types.is_float_dtype(out[col]):
            out[col] = [_fmt_float(v) for v in out[col]]
        elif out[col].dtype == object or pd.api.types.is_string_dtype(out[col]):
            out[col] = [_fmt_float(v) if isinstance(v, float) else "-" if v is None
                        else plain_numbers(v) if isinstance(v, str) else v for v in out[col]]
    return out


def _text_table(df: pd.DataFrame, shown: pd.DataFrame,
                answer: Sequence[str] = ()) -> tuple[str, list[str]]:
    """(the table as text within WIDTH columns, notes): numbers right-aligned, text left. A
    table too wide moves its columns of one value (over several rows) to a note ("batch 4"),
    then cuts the widest text columns with "…" (one line per row: a screen holds more rows than
    a wrapped table), then leaves out columns from the right, the `answer` columns (raw names
    or headers) and the first last of all; notes say which."""
    cells = [[str(v) for v in shown[c]] for c in shown.columns]
    heads = [str(c) for c in shown.columns]
    right = [pd.api.types.is_numeric_dtype(df[c]) or all(
        re.match(r"^[-+]?[\d.,]+(\s|%|x|$)", v) or v == "-" for v in col)
        for c, col in zip(df.columns, cells)]
    kept = [i == 0 or str(c) in answer or h in answer
            for i, (c, h) in enumerate(zip(df.columns, heads))]
    widths = [max([len(h)] + [len(v) for v in col]) for h, col in zip(heads, cells)]
    notes: list[str] = []
    if sum(widths) + 2 * (len(widths) - 1) > WIDTH and len(shown) > 1:
        same = [i for i, col in enumerate(cells) if not kept[i] and len(set(col)) == 1]
        if same:
            notes.append(", ".join(f"{heads[i]} {cells[i][0]}" for i in same))
            cells, heads, right, widths, kept = ([x for i, x in enumerate(xs) if i not in same]
                                                 for xs in (cells, heads, right, widths, kept))
    least = [w if r else min(w, max(20, len(h))) for w, r, h in zip(widths, right, heads)]
    drop: list[int] = []  # columns left out, from the right, answer columns last
    for i in sorted(range(len(widths)), key=lambda j: (kept[j], -j))[:-1]:
        if sum(w + 2 for j, w in enumerate(least) if j not in drop) - 2 <= WIDTH:
            break
        drop.append(i)
    if drop:
        notes.append(f"{len(drop)} more columns ({', '.join(heads[i] for i in sorted(drop))}): "
                     f"{FULL}")
        cells, heads, right, widths = ([x for i, x in enumerate(xs) if i not in drop]
                                       for xs in (cells, heads, right, widths))
    excess = sum(widths) + 2 * (len(widths) - 1) - WIDTH
    while excess > 0:
        text = [i for i in range(len(widths)) if not right[i] and widths[i] > max(20, len(heads[i]))]
        if not text:
            break
        i = max(text, key=lambda j: widths[j])  # the widest loses a column: widths even out
        widths[i] -= 1
        excess -= 1
    cut = [h for h, w, col in zip(heads, widths, cells) if any(len(v) > w for v in col)]
    if cut:
        notes.insert(len(notes) - bool(drop), f"cells cut to fit (…) in {', '.join(cut)}: {FULL}")
    lines = [heads] + [[v if len(v) <= w else v[:w - 1] + "…" for v, w in zip(row, widths)]
                       for row in zip(*cells)]
    return "\n".join("  ".join(v.rjust(w) if r else v.ljust(w) for v, w, r in
                               zip(line, widths, right)).rstrip() for line in lines), notes


def wrap(line: str, first: str = "", rest: str = "") -> str:
    """A line wrapped to WIDTH columns (prefixes for its first and further lines); a `code span`
    (a command to copy) and a flag with its value (--precision bf16-mixed) are never broken,
    even where that makes their line longer, and neither is a clause (between "; ") of half a
    line or less (a hint such as "run the same command with --resume" is read whole, however
    long the path before it). A code span loses its backticks (a command copied from a
    terminal with them would run as a shell substitution)."""
    glued = re.sub(r"`[^`]*`|--[\w-]+ [^\s`-][^\s,;:)`]*",
                   lambda m: m.group().strip("`").replace(" ", "\0"), line)
    glued = "; ".join(c.replace(" ", "\0") if len(c) <= WIDTH // 2 else c
                      for c in glued.split("; "))
    return "\n".join(textwrap.wrap(glued, WIDTH, initial_indent=first, subsequent_indent=rest,
                                   break_on_hyphens=False, break_long_words=False)
                     ).replace("\0", " ") or first


def _render_sections(headline: list[str], sections: list[tuple[str, pd.DataFrame, str, list[str]]],
                     findings: list[str], fmt: str, answer: Sequence[str] = ()) -> str:
    """The headline, then each (title, table, caption, notes), then the findings; no line
    twice (a finding that repeats the headline or another finding is left out)."""
    parts = []
    findings = [f for f in dict.fromkeys(findings) if f not in headline]
    if fmt != "latex":
        headline, findings = ([plain_numbers(h) for h in headline],
                              [plain_numbers(f) for f in findings])
    if headline:
        parts.append({"latex": "".join(f"\\noindent {_latex_escape(h)}\\\\\n" for h in headline),
                      "markdown": "".join(f"**{h}**  \n" for h in headline)}.get(
            fmt, "".join(wrap(h, "", "  ") + "\n" for h in headline)))
    for title, df, caption, notes in sections:
        if df.empty:
            continue
        shown = readable(df, shares=title.split(": ")[-1].startswith("share "))
        shown.columns = [header(c) for c in shown.columns]
        notes = list(dict.fromkeys(notes))
        if fmt != "latex":
            caption, notes = plain_numbers(caption), [plain_numbers(n) for n in notes]
        if fmt == "markdown":
            head = f"#### {title}\n\n" if title else ""
            lines = ([caption] if caption else []) + notes
            tail = "\n" + "".join(f"{line}  \n" for line in lines) if lines else ""
            parts.append(f"{head}{shown.to_markdown(index=False)}\n{tail}")
        elif fmt == "latex":
            latex = shown.to_latex(index=False, escape=True,
                                   caption=(f"{title}. {caption}" if caption else title) or None)
            parts.append(latex.replace("±", r"$\pm$") + "".join(f"% {n}\n" for n in notes))
        else:
            head = f"{wrap(title)}\n" if title else ""
            body, more = _text_table(df, shown, answer)
            tail = "".join(f"{wrap(line, '', '  ')}\n" for line in
                           dict.fromkeys(([caption] if caption else []) + notes + more))
            parts.append(f"{head}{body}\n{tail}")
    if findings:
        if fmt == "latex":
            items = "".join(f"  \\item {_latex_escape(f)}\n" for f in findings)
            parts.append(f"\\begin{{itemize}}\n{items}\\end{{itemize}}\n")
        elif fmt == "markdown":
            parts.append("\n".join("- " + f for f in findings) + "\n")
        else:
            parts.append("\n".join(wrap(f, "* ", "  ") for f in findings) + "\n")
    return "\n".join(parts) if parts else "no records\n"


def _latex_escape(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("$", r"\$"),
                 ("#", r"\#"), ("_", r"\_"), ("{", r"\{"), ("}", r"\}")):
        text = text.replace(a, b)
    return text.replace("±", r"$\pm$")


def concat(reports: list[Report], fmt: str = "text", details: bool = False) -> str:
    """Several reports rendered one after the other (JSON: one list of all their records)."""
    if fmt == "json":
        return json.dumps([r for rep in reports for r in rep.records], indent=1) + "\n"
    if fmt == "csv" and len(reports) == 1:
        return reports[0].render("csv")
    out = []
    for rep in reports:
        head = {"markdown": f"### {rep.kind}\n\n", "latex": f"% {rep.kind}\n",
                "csv": f"# {rep.kind}\n"}.get(fmt, f"== {rep.kind}\n")
        out.append(head + rep.render(fmt, details))
    return "\n".join(out)
