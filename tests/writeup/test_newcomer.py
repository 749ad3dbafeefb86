"""Issue 21's write-up defects, on real records (tests/writeup/data/README.md): every kind's
section asks its question, dist and doctor have plots, the bench table fits a 1400 px window,
and `lmperf report` reads what `lmperf compare --json FILE` (and any `--json FILE`) writes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from lmperf.catalog import BY_KIND
from lmperf.cli import main
from lmperf.questions.writeup.api import QUESTIONS, report
from lmperf.questions.writeup.html import table_html
from lmperf.questions.writeup.sections import readable_table

DATA = Path(__file__).parent / "data"


def _sections(page: str) -> dict[str, str]:
    """section id -> its HTML."""
    return dict(re.findall(r'<section id="([^"]+)">(.*?)</section>', page, flags=re.S))


def test_every_kind_asks_its_question():
    assert {k: QUESTIONS[k] for k in BY_KIND} == {k: q.ask for k, q in BY_KIND.items()}
    assert {"dist", "doctor", "compare"} <= set(QUESTIONS)


def test_dist_and_doctor_sections_have_their_question_and_plots(tmp_path):
    page = report([DATA / "dist.jsonl", DATA / "doctor.jsonl"], out=tmp_path / "r.html").read_text()
    sections = _sections(page)
    for kind in ("dist", "doctor"):
        html = sections[f"kind-{kind}"]
        assert f"<h2>{kind}: {BY_KIND[kind].ask}</h2>" in html.replace("&#x27;", "'")
        assert html.count('<img src="data:image/png;base64,') >= 1, kind
        assert 'class="missing"' not in html, kind
    assert sections["kind-dist"].count("<img") == 2  # strategies, and collectives
    assert "collective timings have an IQR/median above 10%" in sections["kind-dist"]


def test_mean_and_std_share_a_cell_on_two_lines():
    import pandas as pd

    table = readable_table("t", pd.DataFrame({"forward (ms)": ["51.43 ± 34.41", "-"]}))
    html = table_html(table)
    assert '<td class="num">51.43<br>± 34.41</td>' in html and '<td class="num">-</td>' in html


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None and os.environ.get("CI") != "true",
                    reason="headless chromium not installed (under CI=true this fails instead)")
def test_bench_table_fits_a_1400px_window_in_chromium(tmp_path):
    assert shutil.which("chromium"), "chromium is not on PATH: .ci/run installs Debian's as root"
    page = report([DATA / "bench_wide.jsonl"], out=tmp_path / "r.html").read_text()
    # measure in the browser: a copy of the page without its CSP, with a script that writes
    # each table's width and its box's width into the DOM that --dump-dom prints
    page = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page)
    probe = ("<script>window.onload=()=>{document.body.dataset.w=[...document.querySelectorAll("
             "'section table')].map(t=>Math.ceil(t.getBoundingClientRect().width)+'/'+"
             "t.parentElement.clientWidth).join(' ')}</script>")
    (tmp_path / "probe.html").write_text(page.replace("</head>", probe + "</head>"))
    dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu",
                          "--window-size=1400,1000", "--dump-dom",
                          (tmp_path / "probe.html").as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    widths = re.search(r'data-w="([^"]+)"', dom).group(1).split()
    table, box = map(int, widths[0].split("/"))  # the bench section's main table
    assert table <= box, widths


def test_report_reads_compare_json_and_any_json_array(tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["report", str(DATA / "compare.json"), str(DATA / "bench.json"),
                 "-o", str(out)]) == 0
    sections = _sections(out.read_text())
    assert "phases: NEW / BASE per matched spec" in sections["kind-compare"]
    assert "too few samples" in sections["kind-compare"]  # 2 steps a side: no verdict
    assert "<h3></h3>" not in sections["kind-compare"]
    assert "tiny" in sections["kind-bench"]


def test_table_and_compare_read_a_json_array_of_records(capsys):
    assert main(["table", str(DATA / "bench.json")]) == 0
    assert "tiny" in capsys.readouterr().out
    assert main(["compare", str(DATA / "bench.json"), str(DATA / "bench.json")]) == 0
    capsys.readouterr()
    assert main(["table", str(DATA / "compare.json")]) == 2  # rows of a comparison, not runs
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "lmperf compare's rows: `lmperf report` shows them" in err[0]


def test_each_section_gives_its_answer_before_its_table(tmp_path):
    """Issue 43, item 11: a section's findings (the command's headline first) come before the
    table behind them, in HTML and Markdown."""
    files = sorted(DATA.glob("*.jsonl"))
    page = report(files, out=tmp_path / "r.html").read_text()
    checked = 0
    for anchor, html in _sections(page).items():
        if "<h3>findings</h3>" in html and "<table" in html:
            assert html.index("<h3>findings</h3>") < html.index("<table"), anchor
            checked += 1
    assert checked >= 3
    text = report(files, out=tmp_path / "r.md", format="markdown").read_text()
    for part in text.split("\n## ")[1:]:
        if "### findings" in part and "\n|" in part:
            assert part.index("### findings") < part.index("\n|"), part.splitlines()[0]
