"""A clean exit is the rule: 20 repeated 2-rank runs of the overlapped strategy (async all-reduces
from autograd hooks), each through lmperf's rank code and a normal interpreter exit, none
aborting with "terminate called without an active exception" (see tests/parallel/exit_check.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPEATS = 20


def test_overlap_runs_exit_cleanly(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "tests.parallel.exit_check", str(REPEATS), str(tmp_path)],
                          capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.splitlines()[-1])
    assert len(results) == 2 * REPEATS
    aborted = [r for r in results if r["terminate_called"]]
    failed = [r for r in results if r["exit"] != 0]
    assert not aborted, aborted[:2]
    assert not failed, failed[:2]
