"""Every relative link in README.md and docs/**/*.md points to a file that exists, and a link to a
heading of a Markdown page (`page.md#heading`, `#heading`) to a heading that page has (GitHub's
anchors: lower case, punctuation dropped, spaces as hyphens)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
# [text](target) and ![alt](target); the target ends at whitespace or ')'
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def relative_links(page: Path) -> list[str]:
    """The link targets of a Markdown page that are files in this repository (no URL, no
    bare #anchor), with any #anchor removed; code blocks and inline code are skipped."""
    text = INLINE_CODE.sub("", FENCE.sub("", page.read_text()))
    out = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue  # http:, https:, mailto:, ... and anchors in the same page
        out.append(target.split("#", 1)[0])
    return out


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings (a repeated heading gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def anchored_links(page: Path) -> list[tuple[Path, str]]:
    """(target page, anchor) of every link to a heading of a Markdown page."""
    text = INLINE_CODE.sub("", FENCE.sub("", page.read_text()))
    out = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or "#" not in target:
            continue
        path, anchor = target.split("#", 1)
        dest = page if not path else page.parent / path
        if dest.suffix == ".md" and dest.exists():
            out.append((dest, anchor))
    return out


def test_the_pages_exist():
    assert (REPO / "README.md").exists() and len(PAGES) > 1


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page: Path):
    missing = [t for t in relative_links(page) if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(REPO)} links to missing files: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_anchors_resolve(page: Path):
    missing = [f"{d.relative_to(REPO)}#{a}" for d, a in anchored_links(page) if a not in anchors(d)]
    assert not missing, f"{page.relative_to(REPO)} links to missing headings: {missing}"


def test_the_link_pattern_reads_what_it_should(tmp_path: Path):
    page = tmp_path / "p.md"
    page.write_text("see [a](docs/a.md#x), ![img](i.png), [web](https://x.org), [here](#top)\n"
                    "`[not](code.md)`\n```\n[nor](fenced.md)\n```\n")
    assert relative_links(page) == ["docs/a.md", "i.png"]


def test_anchors_follow_github(tmp_path: Path):
    page = tmp_path / "p.md"
    page.write_text("# `lmperf bench`: how long?\n## Will it fit: (`--gib`)\n## Same\n## Same\n")
    assert anchors(page) == {"lmperf-bench-how-long", "will-it-fit---gib", "same", "same-1"}
