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
