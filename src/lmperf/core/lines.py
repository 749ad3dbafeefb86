"""Lines for a terminal: WIDTH columns, and wrapping that never breaks a command to copy
(stdlib only: stderr's notes use it before pandas or torch is imported)."""

from __future__ import annotations

import re
import textwrap

WIDTH = 120  # columns of a text rendering and of a line on stderr (a terminal, a screen)


def wrap(line: str, first: str = "", rest: str = "") -> str:
    """A line wrapped to WIDTH columns (prefixes for its first and further lines); a `code span`
    (a command to copy) and a flag with its value (--precision bf16-mixed) are never broken,
    even where that makes their line longer."""
    glued = re.sub(r"`[^`]*`|--[\w-]+ [^\s`-][^\s,;:)`]*",
                   lambda m: m.group().replace(" ", "\0"), line)
    return "\n".join(textwrap.wrap(glued, WIDTH, initial_indent=first, subsequent_indent=rest,
                                   break_on_hyphens=False, break_long_words=False)
                     ).replace("\0", " ") or first
