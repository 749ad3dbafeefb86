"""Which events of a trace mark a phase (forward, loss, backward, optimizer), for lmperf's own
traces and for any torch.profiler export.

Explicit markers: a `user_annotation` range whose name IS the phase, in any case and decoration
("## forward ##"); the innermost one holding an event names its phase. Implicit markers, used
only where no explicit range holds the event: autograd's backward nodes and every op on its
threads, the optimizer's ranges, a module's forward; priority (backward > optimizer > forward)
decides between them, not nesting. The names each looks for: docs/commands/profile.md, "How a
trace is read".
"""

from __future__ import annotations

import re
from typing import Mapping

import numpy as np
import pandas as pd

from lmperf.questions.profile.intervals import merged
from lmperf.questions.profile.range_names import BACKWARD, FORWARD, LOSS, OPTIMIZER

EXPLICIT_LABELS: tuple[str, ...] = (FORWARD, LOSS, BACKWARD, OPTIMIZER)
IMPLICIT_PRIORITY: tuple[str, ...] = (BACKWARD, OPTIMIZER, FORWARD)

_EXPLICIT = re.compile(r"^[\W_]*(forward|loss|backward|optimizer)[\W_]*$", re.IGNORECASE)
_AUTOGRAD = "autograd::engine::evaluate_function"
_AUTOGRAD_THREAD = "pt_autograd_"
_OPTIMIZER = re.compile(r"^Optimizer\.(step|zero_grad)#")
_MODULE_FORWARD = re.compile(r"^(nn\.Module: |[A-Za-z_][\w.]*\.forward$)")


def explicit_phase(name: str) -> str | None:
    """The phase a range named `name` marks by its name ("## forward ##" -> "forward"), or None."""
    m = _EXPLICIT.match(name)
    return m.group(1).lower() if m else None


def implicit_phase(name: str) -> str | None:
    """The phase a host range (user_annotation) named `name` implies, or None: Optimizer.step# /
    zero_grad# -> optimizer, "X.forward" -> forward. The other implicit markers are events, not
    ranges (`marker_candidates`: cpu_op autograd nodes and ops on autograd's threads -> backward;
    python_function "nn.Module: X" -> forward)."""
    if _OPTIMIZER.match(name):
        return OPTIMIZER
    return FORWARD if _MODULE_FORWARD.match(name) else None


def autograd_threads(thread_names: Mapping[tuple, str]) -> set[tuple]:
    """(pid, tid) of the threads Kineto's thread_name metadata names as autograd's device
    threads; `thread_names` maps (pid, tid) to that name."""
    return {key for key, name in thread_names.items() if _AUTOGRAD_THREAD in name}


def _on_threads(df: pd.DataFrame, autograd: set[tuple]) -> np.ndarray:
    """Whether each row (pid, tid columns) is on one of the `autograd` threads."""
    if not autograd or df.empty:
        return np.zeros(len(df), bool)
    return pd.MultiIndex.from_arrays([df["pid"], df["tid"]]).isin(list(autograd))


def marker_candidates(ops: pd.DataFrame, autograd: set[tuple] = frozenset()) -> np.ndarray:
    """Which cpu_ops (a frame with name, pid, tid) may be implicit markers: autograd nodes and
    every op on an autograd thread (a bool mask)."""
    node = ops["name"].str.startswith(_AUTOGRAD).to_numpy(dtype=bool)
    return node | _on_threads(ops, autograd)


def markers(ranges: pd.DataFrame, events: pd.DataFrame) -> pd.DataFrame:
    """The implicit markers: start_us, end_us, label, from host ranges (user_annotation, by
    name) and from other events (cpu_op / python_function frame with a cat column, the rows
    `marker_candidates` and the module forwards kept: their cat is their label)."""
    parts = []
    for df in (ranges, events):
        if df.empty:
            continue
        if df is events:  # vectorised: tens of thousands of rows on a real trace
            label = np.where(df["cat"].to_numpy() == "cpu_op", BACKWARD, FORWARD).astype(object)
        else:
            label = np.array([implicit_phase(n) for n in df["name"]], dtype=object)
        keep = ~pd.isna(label)
        parts.append(pd.DataFrame({
            "start_us": df["start_us"].to_numpy()[keep], "end_us": df["end_us"].to_numpy()[keep],
            "label": pd.Categorical(label[keep])}))
    if not parts:
        return pd.DataFrame(columns=["start_us", "end_us", "label"])
    return pd.concat(parts, ignore_index=True)


def compact(marks: pd.DataFrame) -> pd.DataFrame:
    """The markers as disjoint intervals per label (start_us, end_us, label): what the phase
    lookups use, merged once (overlapping or nested markers of one label count once)."""
    parts = []
    for label, g in marks.groupby("label", sort=False):
        s, e = merged(g["start_us"].to_numpy(), g["end_us"].to_numpy())
        parts.append(pd.DataFrame({"start_us": s, "end_us": e, "label": label}))
    if not parts:
        return pd.DataFrame(columns=["start_us", "end_us", "label"])
    return pd.concat(parts, ignore_index=True)

