"""`lmperf --help`, each command's --help and a bad value answer without importing torch or
pandas (a torch import costs 1.5 to 16 s on a small machine), and the torch-free name lists
the command line checks against are the registries' own."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
from lmperf.cli import main
try:
    code = main({argv!r})
except SystemExit as exc:
    code = exc.code
print("CODE", code, "torch" in sys.modules, "pandas" in sys.modules)
"""


@pytest.mark.parametrize("argv, code", [
    (["--help"], 0),
    (["bench", "--help"], 0),
    (["train", "--help"], 0),
    (["bench", "--size", "nope"], 2),
    (["bench", "--context", "0"], 2),
    (["profile", "--precision", "fp8"], 2),
    (["memory", "--attention", "flashy"], 2),
    (["train", "--steps", "0"], 2),
    (["profile", "--warmup", "-1"], 2),
])
def test_help_and_bad_values_import_neither_torch_nor_pandas(argv, code):
    proc = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True,
                          text=True, timeout=120)
    last = proc.stdout.strip().splitlines()[-1]
    assert last == f"CODE {code} False False", (last, proc.stderr[-500:])
    if code == 2:
        assert len(proc.stderr.strip().splitlines()) == 1 and "--" in proc.stderr


def test_the_torch_free_names_are_the_registries():
    from lmperf import names
    from lmperf.kernels import NAMES
    from lmperf.runtime.precision import REGIMES
    from lmperf.workload import spec

    assert names.REGIME_NAMES == tuple(REGIMES)
    assert names.ATTENTION_NAMES == NAMES
    assert spec.MODES == names.MODES and spec.OPTIMIZERS == names.OPTIMIZERS
