"""lmperf.compare on real bench records (tests/compare/data, see its README): matching, verdicts,
what is not compared and why, environment warnings, every output format."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest

import lmperf.questions.compare
from lmperf.questions.compare.records import timed_groups, timed_phases
from lmperf.errors import SpecError
from lmperf.measure.compare import FASTER, INCONCLUSIVE, SAME, SLOWER, VERDICTS
from lmperf.results.store import read_records

DATA = Path(__file__).parent / "data"
BASE, AGAIN, TWICE = DATA / "base.jsonl", DATA / "again.jsonl", DATA / "twice.jsonl"
PHASES = ["forward", "backward", "optimizer", "step"]


def test_the_package_is_the_api_function():
    report = lmperf.compare(BASE, AGAIN)
    assert report.kind == "compare"
    assert set(report.frame["verdict"]) <= set(VERDICTS)


def test_a_file_against_itself_is_no_change_everywhere():
    df = lmperf.compare(BASE, BASE).frame
    assert len(df) == 2 * len(PHASES)  # fp32 and bf16-mixed, four phases each
    assert (df["ratio"] == 1.0).all()
    assert (df["verdict"] == SAME).all()
    assert ((df["ci_low"] <= 1.0) & (df["ci_high"] >= 1.0)).all()


def test_two_runs_of_the_same_specs_are_mostly_no_significant_change():
    df = lmperf.compare(BASE, AGAIN).frame
    assert (df["verdict"] == SAME).mean() >= 0.75


def test_a_model_doing_twice_the_work_is_slower_in_every_phase():
    report = lmperf.compare(BASE, TWICE, ignore=["model"])
    df = report.frame
    assert sorted(set(df["phase"])) == sorted(PHASES)
    assert (df["verdict"] == SLOWER).all(), df[["phase", "ratio", "ci_low", "ci_high"]]
    # twice the work measured 1.4x-2.3x slower per phase in these real runs
    assert ((df["ratio"] > 1.3) & (df["ci_low"] > 1.0)).all()
    throughput = report.table("throughput and memory")
    assert (throughput["tokens_per_s_ratio"] < 0.75).all()
    # and the other way round it is faster
    assert (lmperf.compare(TWICE, BASE, ignore=["model"]).frame["verdict"] == FASTER).all()


def test_frame_columns_are_numeric_and_named_with_units():
    df = lmperf.compare(BASE, TWICE, ignore=["model"]).frame
    for col in ("base_median_ms", "new_median_ms", "ratio", "ci_low", "ci_high", "change_pct"):
        assert df[col].dtype.kind == "f", col
    assert df["base_n"].dtype.kind == "i"
    assert "model" not in df.columns  # ignored fields are not part of the identity
    assert np.allclose(df["change_pct"], (df["ratio"] - 1) * 100)


def test_the_same_inputs_give_the_same_report():
    a = lmperf.compare(BASE, AGAIN).frame
    b = lmperf.compare(BASE, AGAIN).frame
    assert a.equals(b)
    c = lmperf.compare(BASE, AGAIN, seed=1).frame
    assert not a[["ci_low", "ci_high"]].equals(c[["ci_low", "ci_high"]])


def test_specs_that_differ_are_listed_not_dropped():
    report = lmperf.compare(BASE, TWICE)  # model differs, and is not ignored
    assert report.frame.empty
    table = report.table("not compared")
    assert len(table) == 4  # two specs on each side
    assert set(table["side"]) == {"BASE", "NEW"}
    assert table["reason"].str.contains("nearest in (?:NEW|BASE) differs in model").all()
    assert table["reason"].str.endswith("; add --ignore model to compare them").all()
    assert any("not compared" in f for f in report.findings)
    assert ("not compared: the sides differ in model (None vs tests.fixtures.models:twice); add "
            "--ignore model to compare them") in report.findings
    assert "no records" not in report.render("text")


def test_a_failed_run_on_one_side_is_listed_with_its_reason():
    new = copy.deepcopy(read_records(AGAIN))
    new[0].update(status="oom", message="out of memory\n(tried 2 GiB)", metrics=None)
    report = lmperf.compare(read_records(BASE), new)
    assert len(report.frame) == len(PHASES)  # the other spec is still compared
    row = report.table("not compared").iloc[0]
    assert row["side"] == "both" and row["reason"] == "NEW: oom: out of memory (tried 2 GiB)"


def test_by_compares_two_groups_of_one_file():
    report = lmperf.compare(BASE, by=("precision", "fp32", "bf16-mixed"))
    df = report.frame
    assert len(df) == len(PHASES) and "precision" not in df.columns
    assert "NEW precision=bf16-mixed vs BASE precision=fp32" in report.title
    # a missing user model is spelled 'none'
    pooled = read_records(BASE) + read_records(TWICE)
    by_model = lmperf.compare(pooled, by=("model", "none", "tests.fixtures.models:twice")).frame
    assert (by_model["verdict"] == SLOWER).all()


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(by=("precision", "fp32", "fp16")), "no record in"),
    (dict(by=("colour", "a", "b")), "no record in"),
    (dict(ignore=["colour"]), "--ignore: no record has spec field(s) colour"),
    (dict(confidence=1.5), "--confidence must be in"),
    (dict(min_effect=-1), "--min-effect must be"),
    (dict(resamples=10), "--resamples must be"),
    (dict(kind="attention"), "holds no records of kind 'attention'"),
])
def test_bad_input_raises_spec_error(kwargs, fragment):
    new = None if "by" in kwargs else AGAIN
    with pytest.raises(SpecError, match=None) as info:
        lmperf.compare(BASE, new, **kwargs)
    assert fragment in str(info.value)


def test_one_file_needs_by():
    with pytest.raises(SpecError, match="two results files"):
        lmperf.compare(BASE)


def test_several_records_of_a_spec_are_pooled_run_by_run():
    twice_over = read_records(BASE) + read_records(AGAIN)
    report = lmperf.compare(twice_over, read_records(AGAIN))
    assert (report.frame["base_n"] == 2 * report.frame["new_n"]).all()
    assert any("pooled" in f for f in report.findings)


def test_environment_differences_are_warned_about():
    new = copy.deepcopy(read_records(AGAIN))
    for r in new:
        r["env"]["torch"] = "9.9.9"
    findings = lmperf.compare(read_records(BASE), new).findings
    assert any(f.startswith("warning: the environment differs, torch") and "9.9.9 (NEW)" in f
               for f in findings)
    assert any("load average" in f for f in findings)


def _attention_record(scale: float, seed: int) -> dict:
    """An attention record carrying the raw samples of a real bench record, scaled."""
    from lmperf.measure.stats import summarize

    rng = np.random.default_rng(seed)
    base = read_records(BASE)[0]
    metrics = {f"{name}_ms": summarize([scale * x * rng.uniform(0.99, 1.01)
                                        for x in base["metrics"][f"{src}_ms"]["samples"]])
               for name, src in (("forward", "forward"), ("backward", "backward"),
                                 ("end_to_end", "step"))}
    metrics["memory"] = {"before_backward_bytes": 2**20 * scale}
    return {"schema": 1, "kind": "attention", "status": "ok", "message": "",
            "spec": {"attention": "naive", "context": 64}, "env": base["env"], "metrics": metrics}


def test_attention_records_and_kinds_without_samples():
    memory = {"schema": 1, "kind": "memory", "status": "ok", "message": "",
              "spec": {"size": "tiny", "analysis": "phases"}, "env": {}, "metrics": {"x": 1}}
    base = [_attention_record(1.0, 0), memory]
    new = [_attention_record(2.0, 1), memory]
    assert list(timed_phases(base[0])) == ["forward", "backward", "end_to_end"]
    report = lmperf.compare(base, new, max_load=None)  # the load guard is tested below
    assert list(report.frame["phase"]) == ["forward", "backward", "end_to_end"]
    assert (report.frame["verdict"] == SLOWER).all()
    throughput = report.table("throughput and memory")
    assert throughput["peak_delta_mib"].iloc[0] == pytest.approx(1.0)
    assert "base_tokens_per_s" not in throughput.columns  # attention records have no tokens/s
    reasons = report.table("not compared")["reason"].tolist()
    assert reasons == ["memory records carry no raw timing samples"]


@pytest.mark.parametrize("fmt", ["text", "markdown", "latex", "csv"])
def test_every_format_renders(fmt):
    out = lmperf.compare(BASE, TWICE, ignore=["model"]).render(fmt)
    assert "forward" in out
    if fmt in ("text", "markdown"):
        assert "95% CI" in out and "slower" in out


def test_json_rows_are_plain_json():
    report = lmperf.compare(BASE, TWICE)  # nothing matched: NaN-free 'not compared' rows
    rows = json.loads(report.render("json"))
    assert {r["table"] for r in rows} == {"not compared"}
    rows = json.loads(lmperf.compare(BASE, TWICE, ignore=["model"]).render("json"))
    phases = [r for r in rows if r["table"] == "phases"]
    assert len(phases) == 8 and all(isinstance(r["ratio"], float) for r in phases)
    assert all(r["kind"] == "compare" for r in rows)
    assert all(r["record_kind"] == "bench" for r in phases)
    assert all(not (isinstance(v, float) and math.isnan(v)) for r in rows for v in r.values())


def _loaded(records: list[dict], load: float, device: str = "cpu") -> list[dict]:
    out = copy.deepcopy(records)
    for r in out:
        r["env"].update(load_average_1m=load, cpu_count=2, device=device)
    return out


def test_a_change_seen_on_a_loaded_machine_is_inconclusive():
    base, twice = read_records(BASE), _loaded(read_records(TWICE), 4.0)
    report = lmperf.compare(base, twice, ignore=["model"])
    df = report.frame
    assert (df["verdict"] == INCONCLUSIVE).all()
    assert (df["new_load_per_cpu"] == 2.0).all()
    assert any("'inconclusive'" in f for f in report.findings)
    assert "load/CPU" in report.render("text")
    # the statistics alone still see it, and so does a GPU run (its timings are GPU time)
    assert (lmperf.compare(base, twice, ignore=["model"], max_load=None).frame["verdict"]
            == SLOWER).all()
    gpu = lmperf.compare(_loaded(read_records(BASE), 4.0, "cuda"),
                         _loaded(read_records(TWICE), 4.0, "cuda"), ignore=["model"]).frame
    assert (gpu["verdict"] == SLOWER).all() and gpu["new_load_per_cpu"].isna().all()


def test_rounds_are_compared_once_and_resampled_round_by_round():
    # `lmperf bench --rounds 2` over fp32 and bf16-mixed: 4 round records, then 2 pooled ones
    rounds = DATA / "rounds.jsonl"
    records = read_records(rounds)
    pooled = [r for r in records if r.get("rounds")]
    assert len(records) == 6 and len(pooled) == 2
    assert [len(g) for g in timed_groups(pooled[0])["step"]] == [10, 10]
    report = lmperf.compare(rounds, by=("precision", "fp32", "bf16-mixed"))
    assert (report.frame["base_n"] == 20).all() and (report.frame["new_n"] == 20).all()
    assert any("round by round" in f for f in report.findings)
    assert not any("pooled, and resampled run by run" in f for f in report.findings)
