"""`lmperf report` over real results files of all six kinds (made once for the module): one
valid, self-contained HTML page with every kind's section, table and plot, failed rows with
their (escaped) reason; the Markdown variant; the API; bad input."""

from __future__ import annotations

import base64
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from lmperf.cli import main
from tests.writeup.models import MESSAGE

KINDS = ("bench", "profile", "memory", "train", "attention", "amp")
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run(*argv: str) -> None:
    assert main(list(argv)) == 0, argv


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, Path]:
    """One small results file per kind, from the real commands (inline: no child processes)."""
    d = tmp_path_factory.mktemp("results")
    f = {k: d / f"{k}.jsonl" for k in KINDS}
    quick = ["--batch", "2", "--warmup", "1", "--steps", "2", "--mode", "forward", "--inline"]
    _run("bench", "--size", "tiny", "--context", "16", "32", "--precision", "fp32", *quick,
         "--out", str(f["bench"]))
    _run("bench", "--model", "tests.writeup.models:raising_html", "--context", "16", *quick,
         "--out", str(f["bench"]))  # an error row whose reason is HTML
    _run("profile", "--size", "tiny", "--context", "16", *quick, "--trace", str(d / "t.json"),
         "--out", str(f["profile"]))
    _run("memory", "--size", "tiny", "--batch", "2", "--context", "16", "32", "--mode", "forward",
         "--inline", "--out", str(f["memory"]))
    _run("train", "--steps", "3", "--precision", "fp32", "bf16-mixed", "--context", "16",
         "--batch", "4", "--eval-batches", "1", "--no-plots", "--inline", "--out", str(f["train"]))
    _run("attention", "--attention", "naive", "sdpa", "--context", "16", "32", "--d", "16",
         "--warmup", "0", "--steps", "2", "--inline", "--out", str(f["attention"]))
    _run("amp", "accumulate", "--out", str(f["amp"]))
    _run("amp", "formats", "--out", str(f["amp"]))  # an experiment with a plot of its own
    return f


@pytest.fixture(scope="module")
def page(results, tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("page") / "report.html"
    _run("report", *map(str, results.values()), "-o", str(out), "--title", "lab <notes>")
    return out.read_text(encoding="utf-8")


class StrictHTML(HTMLParser):
    """html.parser with the checks it leaves out: every element closed in order, attributes
    collected, and per section (by id) the tables and images it holds."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.doctype = ""
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.sections: dict[str, dict[str, int]] = {}
        self.ids: set[str] = set()
        self.text: list[str] = []

    def handle_decl(self, decl: str) -> None:
        self.doctype = decl

    def handle_starttag(self, tag: str, attrs: list) -> None:
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if "id" in attrs:
            if attrs["id"] in self.ids:
                self.errors.append(f"duplicate id {attrs['id']}")
            self.ids.add(attrs["id"])
        if tag == "section":
            self.sections[attrs.get("id", "?")] = {"table": 0, "img": 0}
        if tag in ("table", "img") and "section" in self.stack:
            self.sections[list(self.sections)[-1]][tag] += 1
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else 'nothing'}>")
            return
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _parse(html: str) -> StrictHTML:
    parser = StrictHTML()
    parser.feed(html)
    parser.close()
    return parser


def test_page_is_valid_html(page):
    p = _parse(page)
    assert p.doctype.lower() == "doctype html"
    assert not p.errors, p.errors[:5]
    assert not p.stack, p.stack
    names = [t for t, _ in p.tags]
    assert [names.count(t) for t in ("html", "head", "body", "title")] == [1, 1, 1, 1]
    assert names[0] == "html"


def test_no_external_references(page):
    p = _parse(page)
    assert not {t for t, _ in p.tags} & {"script", "link", "iframe", "object", "embed", "base"}
    for tag, attrs in p.tags:
        for name in ("src", "href", "srcset", "action", "data", "poster"):
            value = attrs.get(name)
            if value is None:
                continue
            if name == "src":
                assert value.startswith("data:image/png;base64,"), (tag, value[:60])
                assert base64.b64decode(value.split(",", 1)[1]).startswith(PNG_MAGIC)
            elif name == "href":
                assert value.startswith("#") and value[1:] in p.ids, value
            else:
                raise AssertionError(f"unexpected {name}= on <{tag}>")
    assert not re.search(r"url\(|@import|https?:|//[a-z]", page.split("</style>")[0].lower())
    assert "Content-Security-Policy" in page


def test_every_kind_has_its_section_table_and_plot(page):
    sections = _parse(page).sections
    for kind in KINDS:
        counts = sections[f"kind-{kind}"]
        assert counts["table"] >= 2, (kind, counts)  # its own table(s) + the environment
        assert counts["img"] >= 1, (kind, counts)


def test_course_table_findings_and_environment(page):
    text = " ".join(" ".join(_parse(page).text).split())
    assert "forward (ms)" in text and "±" in text  # bench: medians, the step's mean ± std beside
    assert "step time (median of 2 steps): " in text  # the headline, first among the findings
    assert "the accumulate experiment draws no plot" in text
    assert "load average (1 min)" in text and "torch" in text
    assert "lab <notes>" in text and "lab &lt;notes&gt;" in page  # the title, escaped


def test_failed_row_stays_visible_with_its_escaped_reason(page):
    assert "<script" not in page.lower() and "<b>bold" not in page
    escaped = MESSAGE.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    assert escaped.replace('"', "&quot;") in page
    bench = page.split('id="kind-bench"')[1].split("</section>")[0]
    assert re.search(r'<td class="bad">error \[1\]</td>', bench)  # the course table's row
    assert "runs that did not finish" in bench
    text = " ".join(_parse(bench).text)
    assert "boom <script>" in text  # the reason itself, as text


def test_markdown_writes_pngs_next_to_it(results, tmp_path):
    out = tmp_path / "notes" / "write-up.md"
    _run("report", str(results["bench"]), str(results["amp"]), "--format", "markdown",
         "-o", str(out))
    md = out.read_text(encoding="utf-8")
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert len(links) >= 3  # bench: latency and phases; amp: formats
    for link in links:
        assert "/" not in link and (out.parent / link).read_bytes().startswith(PNG_MAGIC)
    assert "## bench" in md and "## amp" in md and "| size" in md
    assert "&lt;script&gt;" in md and "<script" not in md


def test_python_api_returns_the_path(results, tmp_path):
    import lmperf.questions.writeup

    path = lmperf.report([results["attention"]], out=tmp_path / "a.html")
    assert path == tmp_path / "a.html" and "kind-attention" in path.read_text(encoding="utf-8")


@pytest.mark.parametrize("case", ["missing", "empty", "corrupt"])
def test_bad_input_is_one_line_and_exit_2(case, tmp_path, capsys):
    f = tmp_path / "r.jsonl"
    if case != "missing":
        f.write_text("" if case == "empty" else "{not json\n")
    assert main(["report", str(f), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lmperf: error:") and "\n" not in err
    assert not (tmp_path / "r.html").exists()


def test_unknown_format_is_a_spec_error(results, tmp_path):
    from lmperf.errors import SpecError
    from lmperf.questions.writeup.api import report

    with pytest.raises(SpecError, match="html, markdown"):
        report(results["bench"], out=tmp_path / "x", format="pdf")


def test_only_failed_runs_and_an_unknown_kind(results, tmp_path, capsys):
    """A file whose bench runs all failed still gets its section (plots say why they are
    missing); a record of a kind no question writes is refused in one line naming its line."""
    import json

    from lmperf.results.store import read_records

    failed = [r for r in read_records(results["bench"]) if r["status"] != "ok"]
    f = tmp_path / "odd.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in failed))
    out = tmp_path / "odd.html"
    _run("report", str(f), "-o", str(out))
    page = out.read_text(encoding="utf-8")
    assert not _parse(page).errors
    assert "no ok run to draw" in page
    assert "<img" not in page
    other = dict(read_records(results["attention"])[0], kind="mystery")
    f.write_text(f.read_text() + json.dumps(other) + "\n")
    capsys.readouterr()
    assert main(["report", str(f), "-o", str(tmp_path / "odd2.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"line {len(failed) + 1}" in err and "'mystery'" in err


def test_run_labels_name_what_differs():
    from lmperf.questions.writeup.sections import run_labels

    specs = [{"size": "tiny", "context": 16, "precision": "fp32", "d_model": 64, "seed": 0},
             {"size": "mini", "context": 16, "precision": "fp32", "d_model": 128, "seed": 1},
             {"size": "mini", "context": 16, "precision": "fp32", "d_model": 128, "seed": 1}]
    labels = run_labels([{"spec": s} for s in specs])
    assert labels == ["tiny ctx=16 fp32 seed=0", "mini ctx=16 fp32 seed=1 #1",
                      "mini ctx=16 fp32 seed=1 #2"]


def test_sections_follow_the_questions_and_headers_read_as_words(results, tmp_path):
    """Issue 43 (11): sections came in the files' (alphabetical) order, and columns under their
    raw field names (`peak_gib`, `step_s`)."""
    out = tmp_path / "r.html"
    _run("report", *sorted(map(str, results.values())), "-o", str(out))  # amp.jsonl first
    html = out.read_text(encoding="utf-8")
    ids = [i for i in re.findall(r'<section id="kind-([\w-]+)"', html) if i in KINDS]
    assert ids == list(KINDS)  # bench, profile, memory, train, attention, amp: the questions'
    heads = re.findall(r"<th>([^<]*)</th>", html)
    assert heads and not [h for h in heads if re.fullmatch(r"[a-z0-9]+(_[a-z0-9]+)+", h)], heads


def test_the_bench_plot_draws_medians_and_their_iqr(monkeypatch):
    """The bench plot drew mean +- std where the tables give medians."""
    from matplotlib.axes import Axes

    from lmperf.questions.bench.table import records_frame
    from lmperf.questions.writeup import figures
    from tests.bench.test_table import ok_record

    record = ok_record(step=[1.0, 2.0, 3.0, 4.0, 100.0])  # mean 22, median 3, IQR 2 .. 4
    drawn = []
    monkeypatch.setattr(Axes, "errorbar", lambda self, x, y, yerr=None, **k: drawn.append(
        (list(y), [list(e) for e in yerr])))
    assert figures.bench_latency(records_frame([record]), [record]) is not None
    assert drawn == [([3.0], [[1.0], [1.0]])]  # the median, bars to the quartiles
