"""`lmperf dist` draws its plots beside --out (not into ./results) unless --plots says where."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from lmperf.cli import main
from lmperf.core.report import Report


@pytest.fixture
def asked(monkeypatch) -> dict:
    """Replace the API call of `lmperf dist` by one that records its keywords."""
    from lmperf.questions.parallel import api

    seen: dict = {}

    def fake_dist(what, **kwargs):
        seen.update(kwargs, what=what)
        return Report(kind="dist", frame=pd.DataFrame(), records=[])

    monkeypatch.setattr(api, "dist", fake_dist)
    return seen


def test_plots_default_beside_out(asked, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "elsewhere" / "d.jsonl"
    assert main(["dist", "comm", "--out", str(out)]) == 0
    assert Path(asked["plots"]) == tmp_path / "elsewhere" / "dist-plots"
    assert main(["dist", "comm", "--out", str(out), "--plots", "mine"]) == 0
    assert Path(asked["plots"]) == Path("mine")
    assert main(["dist", "comm", "--out", str(out), "--no-plots"]) == 0
    assert asked["plots"] is None
    assert not (tmp_path / "results").exists()
