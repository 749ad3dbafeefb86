"""What a person reads (issue 28): the default text of `profile`, `memory`, `doctor`, `dist comm`
and `bench`, rendered from the records those commands wrote on the 2-core CPU VM (tests/core/
data/people/, see its README): 120 columns, no scientific notation, shares in percent, the
doctor under 25 lines, bench's ratio against the first precision; and the renderer's rules."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from lmperf.core.kinds import build_reports
from lmperf.core.report import Report
from lmperf.results.store import read_records

DATA = Path(__file__).parent / "data" / "people"
WIDTH = 120  # the terminal
COMMANDS = ("profile", "memory", "doctor", "dist_comm", "bench")
SCIENTIFIC = re.compile(r"\d[eE][-+]?\d")


def text(command: str) -> str:
    """The command's default output (its Report as text), from the records it wrote."""
    return "".join(r.render("text") for r in build_reports(read_records(DATA / f"{command}.jsonl")))


@pytest.mark.parametrize("command", COMMANDS)
def test_default_output_fits_120_columns_without_scientific_notation(command):
    out = text(command)
    lines = out.splitlines()
    assert max(map(len, lines)) <= WIDTH, max(lines, key=len)
    assert not SCIENTIFIC.search(out), SCIENTIFIC.search(out)
    assert len(lines) <= 130  # a screen or two


def test_shares_are_percent_in_every_table_of_profile():
    out = text("profile")
    category = out.split("share of each phase by category\n", 1)[1].split("\n\n", 1)[0]
    assert "44.6%" in category and "0.4464" not in category
    for kept in ("top operators (self time): step", "roofline per phase"):
        assert kept in out
    details = "".join(r.render("text", details=True)
                      for r in build_reports(read_records(DATA / "profile.jsonl")))
    assert "compute-bound" in details and "memory-bound" in details  # the roofline's bounds
    assert "phase times" in details and "top operators (self time): forward" in details


def test_profile_opens_with_what_bounds_the_step_and_the_top_share_in_50_lines():
    """Issue 36: the answer in the first lines (the step against its roofline on a CPU, the top
    entry's share), the whole default text within 50 lines."""
    lines = text("profile").splitlines()
    assert len(lines) <= 50
    head = "\n".join(lines[:5])
    assert re.search(r"^step [\d.]+ ms \(median of \d+; the host's: no GPU\), [\d.]+x its roofline", head)
    assert re.search(r"\ntop of the step: aten::\w+ [\d.]+% ", head)


def test_profile_headers_are_words_with_units():
    out = text("profile")
    out = "".join(r.render("text", details=True)
                  for r in build_reports(read_records(DATA / "profile.jsonl")))
    assert "benchmarked (ms, mean)" in out and "benchmarked_ms_mean" not in out
    assert "time_per_flop_share" not in out


def test_doctor_on_a_cpu_build_is_one_line_per_skip_reason():
    out = text("doctor")
    lines = out.splitlines()
    assert len(lines) < 25
    assert re.search(r"^23 CUDA checks\s+skip \[\d\]", out, re.M)
    assert out.count("no CUDA device") == 1
    assert sum(" ok " in line for line in lines) == 14


def test_dist_comm_bytes_are_human():
    out = text("dist_comm")
    assert "16777216" not in out and "16 MiB" in out and "1 KiB" in out


def test_memory_keeps_peaks_and_saved_tensors():
    out = text("memory")
    assert "peak memory per phase" in out and "largest saved activations" in out


def test_bench_prints_the_ratio_against_the_first_precision():
    """The records of `lmperf bench --size tiny --precision fp32 bf16-mixed` (this VM)."""
    reports = build_reports(read_records(DATA / "bench.jsonl"))
    out = reports[0].render("text")
    ratio = reports[0].tables["precision: median time against fp32"]
    m = {r["spec"]["precision"]: r["metrics"]["step_ms"]["median"] for r in reports[0].records}
    assert ratio["step (x fp32)"].iloc[0] == pytest.approx(m["bf16-mixed"] / m["fp32"])
    assert f"bf16-mixed / fp32: {m['bf16-mixed'] / m['fp32']:.2f}x the step time (median)" in out


def test_bench_headline_is_the_median():
    report = build_reports(read_records(DATA / "bench.jsonl"))[0]
    shown, _, _ = report.display(report)
    step = [r["metrics"]["step_ms"] for r in report.records]
    assert list(shown["step (ms)"]) == [s["median"] for s in step]
    assert list(shown["step mean ± std"]) == [f"{s['mean']:.2f} ± {s['std']:.2f}" for s in step]


def test_renderer_rules():
    from lmperf.core.report import header, human_bytes, plain_numbers

    assert header("benchmarked_ms_mean") == "benchmarked (ms, mean)"
    assert header("gpu_busy_share") == "gpu busy (%)" and header("saved_bytes") == "saved"
    assert header("forward (ms)") == "forward (ms)"  # a title already for people
    assert [human_bytes(b) for b in (512, 1024, 16 * 2**20, 1.5 * 2**30)] == [
        "512 B", "1 KiB", "16 MiB", "1.5 GiB"]
    assert plain_numbers("max |err| 6.5e-07, 1.3e+04 x") == "max |err| 0.00000065, 13,000 x"
    df = pd.DataFrame({"name": ["a " * 90], "ms": [2.226e-05], "peak_mib": [0.5], "share": [0.25]})
    out = Report(kind="demo", frame=df).render("text")
    assert max(map(len, out.splitlines())) <= WIDTH
    assert "0.000022" in out and "512 KiB" in out and "25.0%" in out
    assert Report(kind="demo", frame=df).render("csv").count("2.226e-05") == 1  # raw numbers


def test_brief_leaves_detail_to_the_full_formats():
    df = pd.DataFrame({"x": range(20), "y": range(20)})
    r = Report(kind="demo", tables={"a": df, "b": df}, brief={"a": (["x"], 3), "b": None})
    out = r.render("text")
    assert "17 more rows; 1 more columns (y)" in out and "more table(s) (b)" in out
    assert "| 19 |" in r.render("markdown").replace("  ", " ").replace("  ", " ")


def test_bench_ratio_of_forward_runs_leaves_out_the_phases_they_do_not_run():
    from lmperf.questions.bench.report import build_report

    records = read_records(DATA / "bench.jsonl")
    for r in records:  # as a forward-only sweep records them: no backward, no optimizer
        r["spec"]["mode"] = "forward"
        r["metrics"]["backward_ms"] = r["metrics"]["optimizer_ms"] = None
    ratio = build_report(records).tables["precision: median time against fp32"]
    assert list(ratio.columns) == ["size", "context", "precision", "against", "forward (x fp32)",
                                   "step (x fp32)"]
