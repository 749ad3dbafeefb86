"""The precision lab: each experiment runs on this device and this torch and reports what it saw.

`lmperf.amp("accumulate", ...)` is `lmperf.questions.amp.api.amp`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from lmperf.validate import choice

# In the order `lmperf amp` lists them and `lmperf amp all` runs them.
EXPERIMENT_NAMES: tuple[str, ...] = (
    "formats", "accumulate", "policy", "trace", "toy", "norms", "softmax", "underflow",
    "stagnation",
)


def get_experiment(name: str) -> ModuleType:
    """The experiment module by name; raises SpecError (a ValueError) listing the accepted names."""
    choice("experiment", name, EXPERIMENT_NAMES)
    return importlib.import_module(f"lmperf.questions.amp.{name}")


def __getattr__(name: str) -> object:
    # ExperimentResult and render import pandas: loaded on first use, so `import lmperf` is cheap.
    if name in ("ExperimentResult", "render"):
        from lmperf.questions.amp import base

        return getattr(base, name)
    raise AttributeError(f"module 'lmperf.questions.amp' has no attribute {name!r}")

__all__ = ["EXPERIMENT_NAMES", "ExperimentResult", "get_experiment", "render"]
