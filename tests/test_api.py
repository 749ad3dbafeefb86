"""The Python API: one call per question returns a Report with a DataFrame; the example
notebook runs top to bottom (its code cells executed in order in one namespace, as a kernel
would run them)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

import lmperf

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "lmperf-tour.ipynb"


@pytest.mark.slow
def test_six_calls_return_reports_with_frames():
    reports = {
        "bench": lmperf.bench(size="tiny", context=[32], precision=["fp32"], mode="forward",
                              warmup=0, steps=2, inline=True),
        "profile": lmperf.profile(size="tiny", context=32, mode="forward", warmup=0, steps=2,
                                  inline=True),
        "memory": lmperf.memory(size="tiny", context=[32], inline=True),
        "amp": lmperf.amp("accumulate", n=100),
        "train": lmperf.train(precision=["fp32"], steps=3, inline=True),
        "attention": lmperf.attention(attention=["naive", "sdpa"], context=[64], steps=2,
                                      inline=True),
    }
    for kind, report in reports.items():
        assert isinstance(report, lmperf.Report), kind
        assert report.kind == kind
        assert isinstance(report.frame, pd.DataFrame) and not report.frame.empty, kind
        assert report.records and all(r["kind"] == kind for r in report.records), kind
        assert report.render("text").strip(), kind


def test_every_api_function_shows_its_keywords_and_defaults():
    """`inspect.signature`, `help()` and IDEs see the real functions (no *args/**kwargs
    wrappers): each is the catalog's API function, with a docstring."""
    import inspect

    from lmperf.catalog import QUESTIONS
    from lmperf.core.jobs import resolve

    for q in QUESTIONS:
        fn = getattr(lmperf, q.command)
        assert fn is resolve(q.api), q.command
        assert fn.__doc__ and len(fn.__doc__) > 80, q.command
        params = inspect.signature(fn).parameters
        named = [p for p in params.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        assert len(named) >= 3, q.command
    signature = inspect.signature(lmperf.bench)
    assert signature.parameters["batch"].default == 4
    assert signature.parameters["size"].default is None and "context" in signature.parameters


def test_import_lmperf_is_cheap():
    import subprocess
    import sys

    code = "import sys, lmperf; print('torch' in sys.modules, 'pandas' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    assert out.strip() == "False False"


@pytest.mark.slow
def test_example_notebook_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    namespace: dict = {}
    ran = 0
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        exec(compile(source, f"{NOTEBOOK.name}[cell {i}]", "exec"), namespace)
        ran += 1
    assert ran >= 8
    assert isinstance(namespace["bench"].frame, pd.DataFrame)
    assert (namespace["bench"].frame["status"] == "ok").all()
