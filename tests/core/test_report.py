"""Report: numeric tables rendered in every format; the one place results are formatted."""

from __future__ import annotations

import io
import json
import re

import pandas as pd
import pytest

from lmperf.core.report import FORMATS, Report, concat


def report() -> Report:
    frame = pd.DataFrame({"name": ["a_b", "c"], "ms": [1.23456789, 20.0], "n": [3, 4]})
    return Report(kind="demo", frame=frame, tables={"extra": pd.DataFrame({"x": [0.5]})},
                  findings=["a is 16x faster than c (50% of 100)"],
                  records=[{"kind": "demo", "status": "ok", "spec": {}}], title="demo table")


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_renders_something(fmt):
    assert report().render(fmt).strip()


def test_tables_stay_numeric_until_rendered():
    r = report()
    assert r.frame["ms"].dtype == float
    text = r.render("text")
    assert "1.235" in text and "1.23456789" not in text  # 4 significant digits when shown
    assert r.frame["ms"].iloc[0] == 1.23456789  # the data is untouched


def test_csv_is_the_main_table_and_parses():
    df = pd.read_csv(io.StringIO(report().render("csv")))
    assert list(df.columns) == ["name", "ms", "n"] and len(df) == 2


def test_csv_falls_back_to_the_first_table_without_a_frame():
    r = Report(kind="demo", tables={"t": pd.DataFrame({"x": [1, 2]})})
    assert pd.read_csv(io.StringIO(r.render("csv")))["x"].tolist() == [1, 2]


def test_latex_escapes_and_lists_findings():
    latex = report().render("latex")
    assert "a\\_b" in latex and "\\begin{itemize}" in latex and "50\\% of 100" in latex


def test_markdown_has_titles_and_bullets():
    md = report().render("markdown")
    assert "#### demo table" in md and "#### extra" in md and "- a is 16x faster" in md


def test_json_is_the_records():
    assert json.loads(report().render("json")) == report().records


def test_display_lays_out_the_main_table_for_reading_only():
    def display(rep):
        return pd.DataFrame({"shown": [f"{v:.1f} ms" for v in rep.frame["ms"]]}), "caption!", ["[1] note"]

    r = report()
    r.display = display
    text = r.render("text")
    assert "1.2 ms" in text and "caption!" in text and "[1] note" in text
    assert "1.2 ms" not in r.render("csv")  # csv stays the numbers


def test_unknown_format_and_table_name():
    with pytest.raises(ValueError, match="unknown format"):
        report().render("html")
    with pytest.raises(KeyError, match="tables: extra"):
        report().table("nope")


def test_concat_of_kinds():
    both = concat([report(), report()], "markdown")
    assert both.count("### demo\n") == 2
    assert len(json.loads(concat([report(), report()], "json"))) == 2


def test_empty_report_says_so():
    assert Report(kind="demo").render("text") == "no records\n"


def test_a_too_wide_table_keeps_its_answer_columns_and_captions_its_constants():
    """Issue 43 (3): the column that holds the answer is never the one cut at 120 columns; a
    column of one value moves under the table ("batch 4") before anything is cut."""
    from lmperf.core.report import WIDTH

    frame = pd.DataFrame({"name": ["a", "b"], "batch": [4, 4],
                          **{f"figure_{i}_ms": [1.5, 2.5] for i in range(12)},
                          "verdict": ["slower", "faster"]})
    text = Report(kind="demo", frame=frame, answer=("verdict",)).render("text")
    lines = text.splitlines()
    assert max(map(len, lines)) <= WIDTH
    head = lines[0].split()
    assert head[0] == "name" and head[-1] == "verdict" and "slower" in lines[1]
    assert "batch 4" in lines[3:] and "batch" not in head  # under the table, not a column
    assert re.search(r"\d+ more columns \(figure", text)
    plain = Report(kind="demo", frame=frame).render("text").splitlines()[0].split()
    assert "verdict" not in plain  # without `answer` the rightmost columns go first, as before


def test_a_hint_is_never_broken_by_a_long_path_before_it():
    """Issue 43 (12): the Ctrl-C hint wrapped inside "run the same command with --resume" when
    the results path was long (pytest's temp folders as root): a clause that fits on a line is
    kept whole, whatever the path's length."""
    from lmperf.core.report import WIDTH, wrap

    hint = "run the same command with --resume to finish the rest"
    for n in range(0, 140, 7):
        path = "/tmp/" + "p" * n + "/r.jsonl"
        text = wrap(f"interrupted: 1 finished record(s) are saved in {path}; {hint}", "", "  ")
        assert any(line.strip() == hint or line.endswith(hint) for line in text.splitlines()), text
        assert all(len(line) <= WIDTH or path in line for line in text.splitlines())
