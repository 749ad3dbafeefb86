"""Every flash-triton kernel compiled for sm_80 and sm_90 on this CPU: shared memory within the
target's per-block limit, no register spill (a stack frame within SPILL_BUDGET_BYTES).

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
pytestmark = pytest.mark.slow  # a child process; ~50-75 s on 2 cores with a cold Triton cache

from tests.kernels.triton_report import SHARED_LIMIT_BYTES, Case, cases

SPILL_BUDGET_BYTES = 0
"""Local-memory stack frame allowed per thread: none. With flash_triton.GPU_CONFIGS every kernel
compiles without one on both targets; a kernel that spills pays local-memory traffic on every
loop iteration, which the fp32 rows of the flash suite would then measure."""
CHILD_TIMEOUT_S = 900  # cold cache on 2 busy cores; a warm cache takes seconds
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compiled() -> dict[Case, dict]:
    """Each case's row from the child process (skips the module when it cannot compile)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "tests.kernels.triton_report", "--json",
                           "--control"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT_S)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode == 3 and lines and "skip" in lines[0]:
        pytest.skip(f"cannot compile for NVIDIA targets: {lines[0]['skip']}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {}
    for row in lines:
        key = "control" if row.pop("control", False) else Case(
            row["kernel"], row["target"], row["dtype"], row["head_dim"], row["causal"])
        rows[key] = row
    return rows


def _id(case: Case) -> str:
    return (f"{case.kernel}-{case.target}-{case.dtype}-d{case.head_dim}"
            + ("-causal" if case.causal else ""))


@pytest.mark.parametrize("case", cases(), ids=_id)
def test_kernel_fits_the_target_without_spilling(case, compiled):
    row = compiled[case]
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
