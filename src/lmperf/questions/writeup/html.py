"""The write-up as one self-contained HTML page: styles inline, plots as base64 PNG data URIs,
no script, font, link or image from anywhere else (a Content-Security-Policy in the page says
so to the browser too). Every string that comes from a record is escaped here."""

from __future__ import annotations

import base64
from html import escape

from lmperf.questions.writeup.sections import BASES, STATUSES, Plot, Section, Table

# No network and no script, whatever a record holds: images only as data: URIs, inline styles.
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
NUMBERS = ("Each section says what its numbers are: measured in the runs it names, estimated "
           "(simulated, nothing ran) or predicted (modelled for a device, nothing ran).")
FAILED = ("oom", "error", "unsupported")  # status words that mark a row as failed
WIDE_PX = 800  # a figure wider than this takes a row of its own
WRAP_CHARS = 16  # a text cell longer than this may wrap (a shape, a path); shorter ones never do

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d2430;
       margin: 0; background: #f6f7f9; }
header, main { max-width: 1320px; margin: 0 auto; padding: 0 24px; }
header { padding-top: 20px; }
h1 { font-size: 26px; margin: 8px 0 4px; }
h2 { font-size: 21px; margin: 0 0 6px; border-bottom: 2px solid #d8dde5; padding-bottom: 4px; }
h3 { font-size: 15px; margin: 22px 0 6px; color: #38465a; }
section { background: #fff; border: 1px solid #dde2ea; border-radius: 8px; padding: 18px 22px;
          margin: 18px 0; }
.meta, .counts, .caption, .note { color: #556070; }
.caption { font-style: italic; margin: 4px 0; }
.basis { font-weight: 600; margin: 2px 0 8px; color: #1f6b33; }
.basis.estimated, .basis.predicted { color: #8a5a00; }
main, section { min-width: 0; }
.note { font-size: 13px; margin: 2px 0; }
nav a { margin-right: 14px; }
a { color: #1f5fbf; text-decoration: none; }
.scroll { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; font-size: 12.5px; margin: 4px 0; }
th, td { border: 1px solid #dde2ea; padding: 3px 6px; text-align: left; vertical-align: top; }
td { white-space: nowrap; }
td.wrap { white-space: normal; overflow-wrap: anywhere; min-width: 7em; }
th { background: #eef1f5; font-weight: 600; white-space: normal; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr:nth-child(even) td { background: #fafbfc; }
td.bad, tr:nth-child(even) td.bad { background: #fde8e8; color: #8a1c1c; font-weight: 600; }
td.text { white-space: pre-wrap; min-width: 320px; max-width: 760px; }
td.text div { max-height: 14em; overflow-y: auto; }
.badge { display: inline-block; padding: 0 7px; border-radius: 9px; font-size: 12px;
         margin-right: 4px; background: #e3f1e6; color: #1f6b33; }
.badge.bad { background: #fde8e8; color: #8a1c1c; }
ul.findings li { margin: 3px 0; }
.plots { display: flex; flex-wrap: wrap; gap: 14px 18px; align-items: flex-start; }
.plots figure { margin: 0; flex: 0 1 auto; max-width: calc(50% - 9px); }
.plots figure.wide, .plots p.missing { max-width: 100%; flex-basis: 100%; }
figure img { max-width: 100%; height: auto; border: 1px solid #e4e8ee; display: block; }
figcaption { color: #556070; font-size: 13px; }
.missing { color: #8a5a00; background: #fff6e0; padding: 4px 8px; border-radius: 4px; }
footer { max-width: 1320px; margin: 0 auto 30px; padding: 0 24px; color: #7a8494; font-size: 12px; }
"""


def _e(value: object) -> str:
    """Escape text for element content and attribute values alike."""
    return escape(str(value), quote=True)


def anchor(kind: str) -> str:
    """The fragment id of a kind's section (letters, digits and '-' only)."""
    return "kind-" + "".join(c if c.isalnum() else "-" for c in kind)


def table_html(table: Table, text_columns: tuple[str, ...] = ()) -> str:
    """A Table as <table> (in a horizontally scrolling box), its caption, notes and hidden-row
    count; failed statuses highlighted, `text_columns` kept as multi-line text."""
    if table.frame.empty:
        return ""
    head = "".join(f"<th>{_e(c)}</th>" for c in table.frame.columns)
    rows = []
    for values in table.frame.itertuples(index=False):
        cells = []
        for col, value in zip(table.frame.columns, values):
            text = str(value)
            if col == "status" and text.split(" ")[0] in FAILED:
                cells.append(f'<td class="bad">{_e(text)}</td>')
            elif col in text_columns:
                cells.append(f'<td class="text"><div>{_e(text)}</div></td>')
            elif col in table.numeric:
                cells.append(f'<td class="num">{_number(text)}</td>')
            elif len(text) > WRAP_CHARS:
                cells.append(f'<td class="wrap">{_e(text)}</td>')
            else:
                cells.append(f"<td>{_e(text)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    parts = [f'<div class="scroll"><table><thead><tr>{head}</tr></thead>'
             f'<tbody>{"".join(rows)}</tbody></table></div>']
    if table.caption:
        parts.append(f'<p class="caption">{_e(table.caption)}</p>')
    parts += [f'<p class="note">{_e(n)}</p>' for n in table.notes]
    if table.hidden_rows:
        parts.append(f'<p class="note">{table.hidden_rows} more row(s) not shown: '
                     "<code>lmperf table FILE</code> prints them all.</p>")
    return "\n".join(parts)


def _number(text: str) -> str:
    """A numeric cell's text, escaped; "mean ± std" on two lines (the ± under the mean), so that
    a table of four phases stays inside a 1400 px window (one line each made the course's bench
    table ~1450 px wide)."""
    mean, sep, spread = text.partition(" ± ")
    return f"{_e(mean)}<br>± {_e(spread)}" if sep else _e(text)


def plot_html(plot: Plot) -> str:
    """A figure with its PNG inline, or a note saying why there is none."""
    if plot.png is None:
        return (f'<p class="missing"><strong>{_e(plot.title)}</strong>: '
                f"{_e(plot.note or 'not drawn')}</p>")
    data = base64.b64encode(plot.png).decode("ascii")
    # Two narrow figures share a row; a wide one (more than 800 px, width from the PNG's IHDR
    # chunk at bytes 16..20) gets the row to itself.
    wide = ' class="wide"' if int.from_bytes(plot.png[16:20], "big") > WIDE_PX else ""
    return (f'<figure{wide}><img src="data:image/png;base64,{data}" alt="{_e(plot.title)}">'
            f"<figcaption>{_e(plot.title)}</figcaption></figure>")


def badges(counts: dict[str, int]) -> str:
    """'3 ok', '1 oom' ... as coloured labels (failures red)."""
    return "".join(f'<span class="badge{"" if s == "ok" else " bad"}">{n} {_e(s)}</span>'
                   for s, n in counts.items() if n)


def section_html(section: Section, question: str) -> str:
    """One kind's section: what its numbers are (measured, estimated, predicted), its findings
    (the answer first, as every command prints it), the main table behind them, plots, failed runs, warnings, further tables, environment."""
    kind = section.kind + (f" ({section.basis})" if section.anchor.endswith(section.basis) else "")
    out = [f'<section id="{anchor(section.anchor or section.kind)}">',
           f"<h2>{_e(kind)}: {_e(question)}</h2>",
           f'<p class="basis {section.basis}">{_e(BASES[section.basis])}</p>',
           f'<p class="counts">{sum(section.counts.values())} record(s) '
           f"{badges(section.counts)}</p>"]
    out += [f'<p class="note">{_e(n)}</p>' for n in section.notes]
    if section.findings:
        out.append("<h3>findings</h3>")
        out.append('<ul class="findings">' + "".join(f"<li>{_e(f)}</li>" for f in section.findings)
                   + "</ul>")
    if section.tables:
        main = section.tables[0]
        out += [f"<h3>{_e(main.title)}</h3>", table_html(main, ("message",))]
    if section.plots:
        out.append("<h3>plots</h3>")
        figures = "\n".join(plot_html(p) for p in section.plots)
        out.append(f'<div class="plots">{figures}</div>')
    for extra, text_column in ((section.failures, "reason"), (section.warnings, "warning")):
        if not extra.frame.empty:
            out += [f"<h3>{_e(extra.title)}</h3>", table_html(extra, (text_column,))]
    for table in section.tables[1:]:
        out += [f"<h3>{_e(table.title)}</h3>", table_html(table)]
    out += [f"<h3>{_e(section.environment.title)}</h3>", table_html(section.environment)]
    out.append("</section>")
    return "\n".join(out)


def page_html(title: str, sections: list[Section], questions: dict[str, str],
              inputs: list[tuple[str, dict[str, int]]], generated: str, version: str) -> str:
    """The whole page. `inputs`: (file name, records per kind) per results file; `questions`:
    kind -> the question it answers (section headings)."""
    total = sum(sum(s.counts.values()) for s in sections)
    summary = "".join(
        f'<tr><td><a href="#{anchor(s.anchor or s.kind)}">{_e(s.kind)}</a></td>'
        f"<td>{_e(questions.get(s.kind, ''))}</td><td>{_e(s.basis)}</td>"
        + "".join(f'<td class="num">{s.counts[st]}</td>' for st in STATUSES) + "</tr>"
        for s in sections)
    files = "".join(f"<li><code>{_e(name)}</code>: "
                    + ", ".join(f"{n} {_e(k)}" for k, n in kinds.items()) + "</li>"
                    for name, kinds in inputs)
    nav = "".join(f'<a href="#{anchor(s.anchor or s.kind)}">{_e(s.kind)}</a>' for s in sections)
    body = "\n".join(section_html(s, questions.get(s.kind, s.title)) for s in sections)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(title)}</title>
<style>{STYLE}</style>
</head>
<body>
<header>
<h1>{_e(title)}</h1>
<p class="meta">{total} record(s) from {len(inputs)} results file(s); written {_e(generated)} by
lmperf {_e(version)}. {_e(NUMBERS)}</p>
<nav>{nav}</nav>
<div class="scroll"><table><thead><tr><th>kind</th><th>question</th><th>numbers</th>
{"".join(f"<th>{st}</th>" for st in STATUSES)}</tr></thead><tbody>{summary}</tbody></table></div>
<ul class="meta">{files}</ul>
</header>
<main>
{body}
</main>
<footer>lmperf report: tables, findings and plots rebuilt from the records alone;
<code>lmperf table FILE</code> prints the same tables in a terminal.</footer>
</body>
</html>
"""
