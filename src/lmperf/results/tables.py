"""Titled tables and findings as text or Markdown (kept for the questions not yet on Report)."""

from __future__ import annotations

import pandas as pd


def render_sections(tables: list[tuple[str, pd.DataFrame]], notes: list[str], fmt: str = "text",
                    digits: int | None = None) -> str:
    """Titled tables, then findings as bullets, as text or Markdown.

    `digits`: significant digits for floats (None: pandas' default formatting).
    """
    if fmt not in ("text", "markdown"):
        raise ValueError(f"unknown format {fmt!r}; accepted: text, markdown")
    parts = []
    for title, df in tables:
        if fmt == "markdown":
            body = df.to_markdown(index=False, **({"floatfmt": f".{digits}g"} if digits else {}))
            parts.append(f"#### {title}\n\n{body}\n")
        else:
            fmt_float = (lambda v: f"{v:.{digits}g}") if digits else None
            parts.append(f"{title}\n{df.to_string(index=False, float_format=fmt_float)}\n")
    if notes:
        bullet = "- " if fmt == "markdown" else "* "
        parts.append("\n".join(bullet + n for n in notes) + "\n")
    return "\n".join(parts)
