"""A CPU memory cap no job can start under is refused before anything runs (issue 43: `bench
--max-memory-gib 0.1` exited 0 with an error row, "child process exited with code 1 ...
SpecError"), with the figure this build needs, measured (not a constant) and cached."""

from __future__ import annotations

import re

import pytest

from lmperf.cli import main
from lmperf.core import capfloor
from lmperf.units import GIB


def test_a_cap_under_what_a_job_maps_is_one_line_and_exit_2(tmp_path, capsys):
    out = tmp_path / "b.jsonl"
    code = main(["bench", "--size", "tiny", "--context", "16", "--precision", "fp32",
                 "--max-memory-gib", "0.1", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and not (out.exists() and out.read_text())  # nothing ran, no record
    assert len(err.strip().splitlines()) == 1 and "maps" in err, err
    need = capfloor.floor_bytes(warm=True)  # what a forked job maps here, measured
    assert f"maps {need / GIB:.2f} GiB" in err
    floor = float(re.search(r"give more than ([\d.]+) GiB", err).group(1))
    assert floor == pytest.approx((need + capfloor.MARGIN) / GIB, abs=0.01)


def test_the_figure_is_measured_once_then_read_from_the_cache(monkeypatch):
    first = capfloor.floor_bytes(warm=True)
    assert first and 0.2 * GIB < first < 16 * GIB

    def probe(*args, **kwargs):
        raise AssertionError("probed again")

    monkeypatch.setattr("lmperf.core.launch.WarmChild.run", probe)
    assert capfloor.floor_bytes(warm=True) == first
    capfloor.check_cap(first / GIB + 1, warm=True)  # room to start: no error
