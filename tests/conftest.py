"""Shared test setup: child processes must be able to import `tests.fixtures` and `lmperf`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# Triton chooses between compiling for a GPU and its interpreter when it is first imported, and
# several test modules import it. On a machine without CUDA the interpreter is the only way the
# Triton kernels can run, so turn it on for the whole session before any of them does; a test
# that needs it off removes the variable itself (lmperf reads it at call time).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = Path(__file__).resolve().parents[1]


def _cpu_cap_gib() -> float:
    """The tests' CPU memory cap (RLIMIT_AS, which counts everything mapped): 1.5 GiB in all with
    a CPU build of torch (~0.6 GiB of it mapped at import); what a CUDA build maps at import
    beyond 0.6 GiB (~2.4 more with torch 2.11+cu130) is added."""
    if torch.version.cuda is None:
        return 1.5
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "import torch; print(open('/proc/self/status')"
                          ".read().split('VmSize:')[1].split()[0])"],
                         capture_output=True, text=True, check=True).stdout
    return round(1.5 + max(0.0, int(out) / 2**20 - 0.6), 1)


CPU_CAP_GIB = _cpu_cap_gib()
"""What a test passes as --max-memory-gib on the CPU: 1.5 with the CI's CPU build of torch."""


@pytest.fixture(autouse=True, scope="session")
def _own_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """runtime.lowp caches its measured matmul ratio under $XDG_CACHE_HOME: the tests use a
    cache of their own, never the user's (measured at most once per session)."""
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))


@pytest.fixture(autouse=True)
def _child_import_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Children run `python -m lmperf.core.child`: give them the repo root and src/ on the path."""
    parts = [str(REPO), str(REPO / "src")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(dict.fromkeys(parts)))
