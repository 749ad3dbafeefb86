"""Every flash-triton kernel compiled for sm_80 and sm_90 on this CPU: shared memory within the
target's per-block limit, no register spill (a stack frame within SPILL_BUDGET_BYTES). Both for
the default launches (every dtype, d 64 and 128, causal or not) and for every configuration the
launch search keeps on each target (flash_configs.candidates) at the shapes of issue 37: bf16,
d 64 and 128, causal.

The compilation runs once per session in a child process (`python -m tests.kernels.triton_report
--json`): this session has TRITON_INTERPRET=1 on for the interpreter tests (tests/kernels/
conftest.py), and a Triton imported in interpreter mode compiles nothing. Compiled kernels are
kept in Triton's cache (~/.triton/cache), so only the first run pays the compilation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
pytestmark = pytest.mark.slow  # a child process; 2 cores, cold Triton cache: see CHILD_TIMEOUT_S

from lmperf.kernels.flash_configs import TileConfig
from tests.kernels.triton_report import SHARED_LIMIT_BYTES, Case, cases

SPILL_BUDGET_BYTES = 0
"""Local-memory stack frame allowed per thread: none. The defaults and the search's kept space
compile without one on both targets; a kernel that spills pays local-memory traffic on every
loop iteration, which the flash suite would then measure."""
CHILD_TIMEOUT_S = 900  # cold cache on 2 busy cores; a warm cache takes seconds
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compiled() -> dict[Case, dict]:
    """Each case's row from the child process (skips the module when it cannot compile)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "tests.kernels.triton_report", "--json",
                           "--control", "--search"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=CHILD_TIMEOUT_S)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode == 3 and lines and "skip" in lines[0]:
        pytest.skip(f"cannot compile for NVIDIA targets: {lines[0]['skip']}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {}
    for row in lines:
        key = "control" if row.pop("control", False) else _key(
            row["kernel"], row["target"], row["dtype"], row["head_dim"], row["causal"],
            TileConfig(row["block_q"], row["block_k"], row["num_warps"], row["num_stages"]))
        rows[key] = row
    return rows


def _key(kernel, target, dtype, head_dim, causal, cfg) -> tuple:
    return kernel, target, dtype, head_dim, causal, cfg


def _id(case: Case) -> str:
    return (f"{case.kernel}-{case.target}-{case.dtype}-d{case.head_dim}"
            + ("-causal" if case.causal else "")
            + (f"-{case.tiles.label().replace(' ', '-')}" if case.tiles else ""))


@pytest.mark.parametrize("case", cases(search=True), ids=_id)
def test_kernel_fits_the_target_without_spilling(case, compiled):
    row = compiled[_key(case.kernel, case.target, case.dtype, case.head_dim, case.causal,
                        case.config())]
    assert row["shared_bytes"] <= SHARED_LIMIT_BYTES[case.target], row
    assert row["stack_bytes"] <= SPILL_BUDGET_BYTES, row
    assert row["spill_store_bytes"] == row["spill_load_bytes"] == 0, row
    assert 0 < row["registers"] <= 255, row


def test_a_spilling_kernel_is_seen(compiled):
    # The same measurement on a kernel squeezed to 32 registers (ptxas .maxnreg) must report a
    # stack frame and spill bytes; otherwise the zeros above would prove nothing.
    row = compiled["control"]
    assert row["registers"] <= 32
    assert row["stack_bytes"] > SPILL_BUDGET_BYTES and row["spill_store_bytes"] > 0, row
