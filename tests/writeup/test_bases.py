"""Issue 36: the write-up keeps measured, estimated and predicted apart (a section each, saying
which; never "every number was measured" above a prediction), holds bench's runs against each
other by the CLI's rule (a file that also holds older runs gives the CLI's ratio), and its wide
tables scroll inside the page (checked in Chromium, as test_newcomer.py does)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from lmperf.cli import main
from lmperf.questions.bench.report import build_report
from lmperf.questions.writeup.api import report
from lmperf.results.store import read_records

DATA = Path(__file__).parent / "data"
PEOPLE = Path(__file__).parents[1] / "core" / "data" / "people"


def _sections(page: str) -> dict[str, str]:
    return dict(re.findall(r'<section id="([^"]+)">(.*?)</section>', page, flags=re.S))


@pytest.fixture
def folder(tmp_path) -> Path:
    """A results folder with bench (an older fp32 run, then a run of fp32 and bf16-mixed),
    memory (measured and estimated), attention and plan records."""
    results = tmp_path / "results"
    results.mkdir()
    sweep = read_records(PEOPLE / "bench.jsonl")  # tiny: fp32, then bf16-mixed
    older = json.loads(json.dumps(next(r for r in sweep if r["spec"]["precision"] == "fp32")))
    older["job_id"] = "older"
    for phase in ("forward", "backward", "optimizer", "step"):
        older["metrics"][f"{phase}_ms"]["median"] *= 0.5  # another day: twice as fast
    (results / "bench.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [older, *sweep]))
    shutil.copy(PEOPLE / "memory.jsonl", results / "memory.jsonl")
    shutil.copy(DATA / "memory_estimate.jsonl", results / "memory_estimate.jsonl")
    shutil.copy(DATA / "attention.jsonl", results / "attention.jsonl")
    shutil.copy(DATA / "plan.jsonl", results / "plan.jsonl")
    return results


def _page(folder: Path, out: Path, *more: str) -> str:
    """`lmperf report FOLDER -o OUT`'s page."""
    assert main(["report", str(folder), "-o", str(out), *more]) == 0
    return out.read_text()


def test_measured_estimated_and_predicted_each_get_a_section_that_says_so(folder, tmp_path):
    page = _page(folder, tmp_path / "r.html")
    assert "Every number on this page was measured" not in page
    sections = _sections(page)
    basis = {k: re.search(r'<p class="basis (\w+)">', v).group(1) for k, v in sections.items()}
    assert basis == {"kind-bench": "measured", "kind-memory": "measured",
                     "kind-memory-estimated": "estimated", "kind-attention": "measured",
                     "kind-plan": "predicted"}
    for anchor, html in sections.items():
        said = re.search(r'<p class="basis \w+">([^<]*)</p>', html).group(1)
        if "PREDICTED" in html.replace(said, ""):  # a predicted table: never called measured
            assert basis[anchor] == "predicted" and "MEASURED" not in html, anchor
    assert "simulated step" in sections["kind-memory-estimated"]
    assert "simulated step" not in sections["kind-memory"]
    markdown = _page(folder, tmp_path / "r.md", "--format", "markdown")
    assert "Every number below was measured" not in markdown
    assert "## plan: " in markdown and "**PREDICTED: " in markdown.split("## plan: ")[1]


def test_the_bf16_fp32_ratio_is_the_clis_for_the_same_file(folder, tmp_path, capsys):
    sweep = read_records(PEOPLE / "bench.jsonl")
    ran = build_report(sweep)  # what `lmperf bench` printed when it ran the sweep
    cli = list({f for f in getattr(ran, "headline", []) + ran.findings
                if f.startswith("bf16-mixed / fp32: ")})
    assert len(cli) == 1
    assert main(["table", str(folder / "bench.jsonl")]) == 0  # `lmperf table` of the file
    assert cli[0] in capsys.readouterr().out
    page = report([folder / "bench.jsonl"], out=tmp_path / "r.html").read_text()
    assert cli[0] in page  # not against the older, faster fp32 run
    assert page.count("bf16-mixed / fp32: ") == 1


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None and os.environ.get("CI") != "true",
                    reason="headless chromium not installed (under CI=true this fails instead)")
@pytest.mark.parametrize("width", [900, 1400])
def test_wide_tables_scroll_inside_the_page_in_chromium(folder, tmp_path, width):
    assert shutil.which("chromium"), "chromium is not on PATH: .ci/run installs Debian's as root"
    page = _page(folder, tmp_path / "r.html")
    page = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page)
    # each table: its width, its box's, and whether the box scrolls; then the page's width
    probe = ("<script>window.onload=()=>{document.body.dataset.w=[...document.querySelectorAll("
             "'table')].map(t=>Math.ceil(t.getBoundingClientRect().width)+'/'+"
             "t.parentElement.clientWidth+'/'+getComputedStyle(t.parentElement).overflowX)"
             ".join(' ')+' page:'+document.documentElement.scrollWidth}</script>")
    (tmp_path / "probe.html").write_text(page.replace("</head>", probe + "</head>"))
    dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu",
                          f"--window-size={width},1000", "--dump-dom",
                          (tmp_path / "probe.html").as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    *tables, whole = re.search(r'data-w="([^"]+)"', dom).group(1).split()
    assert int(whole.split(":")[1]) <= width  # the page itself never scrolls sideways
    wide = [t for t in tables if int(t.split("/")[0]) > int(t.split("/")[1])]
    assert wide and all(t.endswith("/auto") for t in wide), tables  # plan's, at least: scrolls
