"""The precision lab: each experiment runs on this device and this torch and reports what it saw."""

from __future__ import annotations

import importlib
from types import ModuleType

from lmperf.amp.base import ExperimentResult, render

# In the order `lmperf amp` lists them and `lmperf amp all` runs them.
EXPERIMENT_NAMES: tuple[str, ...] = (
    "formats", "accumulate", "policy", "trace", "toy", "norms", "softmax", "underflow",
    "stagnation",
)


def get_experiment(name: str) -> ModuleType:
    """The experiment module by name; raises ValueError listing the accepted names."""
    if name not in EXPERIMENT_NAMES:
        raise ValueError(f"unknown experiment {name!r}; accepted: {', '.join(EXPERIMENT_NAMES)}")
    return importlib.import_module(f"lmperf.amp.{name}")


__all__ = ["EXPERIMENT_NAMES", "ExperimentResult", "get_experiment", "render"]
