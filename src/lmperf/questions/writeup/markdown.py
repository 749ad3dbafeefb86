"""The write-up as Markdown (for a README or a notebook) with its plots as PNG files next to it:
`<stem>-<kind>-<n>.png`, linked relatively so the folder can be moved as a whole."""

from __future__ import annotations

from html import escape
from pathlib import Path

import pandas as pd

from lmperf.questions.writeup.html import NUMBERS
from lmperf.questions.writeup.sections import BASES, STATUSES, Section, Table


def md(text: object) -> str:
    """Text safe in a Markdown table cell or paragraph: HTML characters escaped (a renderer that
    passes HTML through must not run a record's '<script>'), '|' escaped, one line."""
    return " ".join(escape(str(text), quote=False).replace("|", "\\|").split())


def _code(text: str) -> str:
    """A code span (nothing inside is rendered, so no escaping but of the backtick itself)."""
    return "`" + " ".join(text.replace("`", "'").split()) + "`"


def table_md(table: Table) -> str:
    """A Table as a Markdown pipe table with its caption and notes under it."""
    if table.frame.empty:
        return ""
    df = pd.DataFrame({md(c): [md(v) for v in table.frame[c]] for c in table.frame.columns})
    align = ["right" if c in table.numeric else "left" for c in table.frame.columns]
    parts = [df.to_markdown(index=False, disable_numparse=True, colalign=align)]
    tail = ([f"*{md(table.caption)}*"] if table.caption else []) + [md(n) for n in table.notes]
    if table.hidden_rows:
        tail.append(f"{table.hidden_rows} more row(s) not shown: `lmperf table FILE` prints "
                    "them all.")
    if tail:
        parts.append("\n\n".join(tail))
    return "\n\n".join(parts)


def section_md(section: Section, question: str, stem: str, folder: Path) -> str:
    """One kind's section; writes its plots as PNG files into `folder`."""
    counts = ", ".join(f"{n} {s}" for s, n in section.counts.items() if n)
    kind = section.kind + (f" ({section.basis})" if section.anchor.endswith(section.basis) else "")
    out = [f"## {md(kind)}: {md(question)}", f"**{md(BASES[section.basis])}**",
           f"{sum(section.counts.values())} record(s): {counts}"]
    out += [f"> {md(n)}" for n in section.notes]
    if section.findings:  # the answer first, then the table behind it (as every command)
        out += ["### findings", "\n".join(f"- {md(f)}" for f in section.findings)]
    if section.tables:
        out += [f"### {md(section.tables[0].title)}", table_md(section.tables[0])]
    if section.plots:
        out.append("### plots")
        for i, plot in enumerate(section.plots, start=1):
            if plot.png is None:
                out.append(f"*{md(plot.title)}: {md(plot.note or 'not drawn')}*")
                continue
            name = f"{stem}-{section.kind}-{i}.png"
            (folder / name).write_bytes(plot.png)
            out.append(f"![{md(plot.title)}]({name})")
    for extra in (section.failures, section.warnings):
        if not extra.frame.empty:
            out += [f"### {md(extra.title)}", table_md(extra)]
    for table in section.tables[1:]:
        out += [f"### {md(table.title)}", table_md(table)]
    if not section.environment.frame.empty:  # compare's rows have no environment of their own
        out += [f"### {md(section.environment.title)}", table_md(section.environment)]
    return "\n\n".join(p for p in out if p)


def page_md(path: Path, title: str, sections: list[Section], questions: dict[str, str],
            inputs: list[tuple[str, dict[str, int]]], generated: str, version: str) -> Path:
    """Write the Markdown write-up to `path` and its PNGs beside it; returns `path`."""
    total = sum(sum(s.counts.values()) for s in sections)
    summary = pd.DataFrame([{"kind": s.kind, "question": questions.get(s.kind, ""),
                             "numbers": s.basis, **{st: s.counts[st] for st in STATUSES}}
                            for s in sections])
    head = [f"# {md(title)}",
            f"{total} record(s) from {len(inputs)} results file(s); written {md(generated)} by "
            f"lmperf {md(version)}. {NUMBERS}",
            summary.to_markdown(index=False),
            "\n".join(f"- {_code(name)}: " + ", ".join(f"{n} {md(k)}" for k, n in kinds.items())
                      for name, kinds in inputs)]
    body = [section_md(s, questions.get(s.kind, s.title), path.stem, path.parent) for s in sections]
    path.write_text("\n\n".join(head + body) + "\n", encoding="utf-8")
    return path
