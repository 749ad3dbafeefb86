"""`lmperf profile` writes its trace beside --out (traces/<run>.json), not into ./results."""

from __future__ import annotations

from pathlib import Path

from lmperf.questions.profile.plan import DEFAULT_TRACE_DIR, plan_profile


def test_trace_defaults_beside_the_results_file(tmp_path):
    out = tmp_path / "elsewhere" / "p.jsonl"
    trace = Path(plan_profile(size="tiny", context=16, device="cpu", out=out).spec.trace)
    assert trace.parent == tmp_path / "elsewhere" / "traces" and trace.suffix == ".json"
    assert trace.parent.is_dir()  # created before the run, as an explicit --trace folder is


def test_trace_without_out_or_with_trace_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # without out, results/traces/ is made in the working directory
    kept = Path(plan_profile(size="tiny", context=16, device="cpu").spec.trace)
    assert kept.parent == DEFAULT_TRACE_DIR
    given = tmp_path / "t.json"
    spec = plan_profile(size="tiny", context=16, device="cpu", trace=given,
                        out=tmp_path / "x" / "p.jsonl").spec
    assert Path(spec.trace) == given
