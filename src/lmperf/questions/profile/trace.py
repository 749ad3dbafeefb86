"""Parse a torch.profiler (Kineto) Chrome trace once into tables of ranges, CPU ops and kernels.

Events are placed by time on ANY thread (backward runs on autograd's threads while the main
thread sits in the `backward` range): an op by its start, a device activity by its launch (the
runtime call with its correlation id), never by when it ran on the device. Which names mark a
phase: `phase_names`. What the parser relies on in each event, why Kineto's
`gpu_user_annotation` ranges are for display only, and the time units: docs/commands/profile.md,
"How a trace is read".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
import numpy as np
import pandas as pd

from lmperf.errors import TraceFormatError
from lmperf.questions.profile import phase_names
from lmperf.questions.profile.range_names import ATTENTION_RANGES, FORWARD, LOSS, STEP, WARMUP
from lmperf.questions.profile.intervals import containing, first_containing, innermost, merged, self_times
from lmperf.questions.profile.phase_names import EXPLICIT_LABELS, IMPLICIT_PRIORITY
from lmperf.questions.profile.trace_read import RawTrace, read_trace

# Innermost-range labels an op or kernel can get; `phase` folds `loss` into `forward`, as
# steps.py nests the loss range inside the forward range.
PHASE_LABELS: tuple[str, ...] = EXPLICIT_LABELS
UNATTRIBUTED = "unattributed"  # a device activity whose launch is not in the trace

_PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")


@dataclass
class Trace:
    """A parsed trace: one DataFrame per kind of event, times in microseconds.

    ranges: record_function ranges. Columns name, pid, tid, start_us, end_us, dur_us, cat,
        on_device (True for `gpu_user_annotation` copies on a device stream, display only),
        external_id ("External id": a device copy shares its host range's), label (the phase a
        host range's name marks, see `phase_names`), step (0-based index of the measured step
        holding the range start, -1 outside; a device copy: its host range's), phase (the phase
        range holding all of it, loss read as forward; missing for step ranges; a device copy:
        its host range's).
    ops: CPU ops (`cpu_op`). Columns name, pid, tid, start_us, end_us, dur_us, self_us
        (dur minus direct cpu_op children on the same thread), depth, phase, phase_range
        (innermost of forward/loss/backward/optimizer), in_step (inside a measured `step`
        range), step (0-based measured step: its `step` range widened to the ProfilerStep#N
        around it; -1 outside), attention (the attention sub-range holding the op). Labels are
        missing (NaN) where no range holds the event.
    kernels: device activities (`kernel`, `gpu_memcpy`, `gpu_memset`). Columns name, kind
        (kernel/memcpy/memset), device, stream, start_us, end_us, dur_us, correlation,
        external_id, launch_name, launch_tid, launch_us, launch_end_us (the launch call's start
        and end), launch_via ("correlation", or "external id" where the trace lacks the launch
        call and the launching cpu_op stands in, see `_kernels`), and
        phase/phase_range/in_step/step/attention taken from the launch; phase
        and phase_range are "unattributed" when no launch matches.
    n_steps: number of measured steps (top-level `step` ranges outside `warmup`; the profiler's
        `ProfilerStep#N` ranges when the model was not annotated).
    device_type: "cuda" when the trace holds device activities, else "cpu".
    device_names: the GPUs the trace's `deviceProperties` names (the machine that recorded it).
    """

    path: str
    ranges: pd.DataFrame
    ops: pd.DataFrame
    kernels: pd.DataFrame
    n_steps: int
    device_type: str
    device_names: list[str] = field(default_factory=list)

    @property
    def unattributed_kernels(self) -> int:
        """How many device activities have no launch in the trace."""
        return int((self.kernels["phase"] == UNATTRIBUTED).sum()) if len(self.kernels) else 0


@dataclass(frozen=True)
class _Steps:
    """The measured steps of the host ranges: `step` ranges outside `warmup`, each indexed over
    the `ProfilerStep#N` around it; else the `ProfilerStep#N` (docs/commands/profile.md)."""

    starts: np.ndarray  # sorted, disjoint
    ends: np.ndarray
    win_starts: np.ndarray
    win_ends: np.ndarray

    @classmethod
    def of(cls, ranges: pd.DataFrame) -> "_Steps":
        prof = ranges[ranges["name"].str.match(_PROFILER_STEP)]
        ps, pe = merged(prof["start_us"].to_numpy(), prof["end_us"].to_numpy())
        steps = ranges[ranges["name"] == STEP]
        if not len(steps):
            return cls(ps, pe, ps, pe)
        warm = ranges[ranges["name"] == WARMUP]
        ws, we = merged(warm["start_us"].to_numpy(), warm["end_us"].to_numpy())
        steps = steps[containing(steps["start_us"].to_numpy(), ws, we) < 0]
        s, e = merged(steps["start_us"].to_numpy(), steps["end_us"].to_numpy())
        if not len(ps):
            return cls(s, e, s, e)
        j = containing(s, ps, pe)
        jj = np.clip(j, 0, None)
        widen = (j >= 0) & (np.bincount(j[j >= 0], minlength=len(ps))[jj] == 1)
        win_s = np.where(widen, np.minimum(s, ps[jj]), s)
        win_e = np.where(widen, np.maximum(e, pe[jj]), e)
        return cls(s, e, win_s, win_e)

    def __len__(self) -> int:
        return len(self.starts)

    def index(self, ts: np.ndarray) -> np.ndarray:
        """0-based measured step of each ts, -1 outside every step window."""
        return containing(ts, self.win_starts, self.win_ends)

    def inside(self, ts: np.ndarray) -> np.ndarray:
        """Whether each ts lies inside a measured step range itself."""
        return containing(ts, self.starts, self.ends) >= 0


@dataclass(frozen=True)
class _Attribution:
    """The host-side ranges and markers that events are placed in, by time (any thread)."""

    host: pd.DataFrame  # CPU-thread user annotations, with their explicit `label`
    marks: pd.DataFrame  # implicit markers (phase_names.markers)
    steps: _Steps

    def phase_range(self, ts: np.ndarray, until: np.ndarray | None = None) -> np.ndarray:
        """The innermost explicit phase range holding each ts (or [ts, until]); where none,
        the implicit marker of highest priority; None where neither."""
        explicit = innermost(ts, self.host, EXPLICIT_LABELS, column="label", until=until)
        implicit = first_containing(ts, self.marks, IMPLICIT_PRIORITY, until=until)
        return np.where(pd.isna(explicit), implicit, explicit)

    def label(self, ts: np.ndarray) -> dict[str, np.ndarray]:
        phase_range = self.phase_range(ts)
        return {
            "phase": np.where(phase_range == LOSS, FORWARD, phase_range),
            "phase_range": phase_range,
            "in_step": self.steps.inside(ts),
            "step": self.steps.index(ts),
            "attention": innermost(ts, self.host, ATTENTION_RANGES),
        }


# ---------------------------------------------------------------------------------------------
# Tables.


def _ranges(raw: RawTrace) -> pd.DataFrame:
    df = raw.ranges
    df["on_device"] = (df["cat"] == "gpu_user_annotation").to_numpy(dtype=bool)
    df["label"] = [None if dev else phase_names.explicit_phase(n)
                   for n, dev in zip(df["name"], df["on_device"])]
    return df.sort_values("start_us", kind="stable").reset_index(drop=True)


def _place_ranges(ranges: pd.DataFrame, attr: _Attribution) -> None:
    """Add step and phase to every range: host ranges by time among host ranges; a device copy
    takes its host range's (matched by External id), as device time says nothing of the step."""
    ts, end = ranges["start_us"].to_numpy(), ranges["end_us"].to_numpy()
    step = attr.steps.index(ts)
    # A range's phase is the innermost phase range that holds all of it (a step holds phases
    # but is in none).
    phase = attr.phase_range(ts, until=end)
    phase = np.where(phase == LOSS, FORWARD, phase)
    on_dev = ranges["on_device"].to_numpy()
    if on_dev.any():
        twin = pd.DataFrame({"step": step, "phase": phase, "id": ranges["external_id"]})[~on_dev]
        twin = twin.dropna(subset=["id"]).drop_duplicates("id").set_index("id")
        ids = ranges["external_id"]
        dev_step = ids.map(twin["step"]).fillna(-1).astype(int).to_numpy()
        dev_phase = ids.map(twin["phase"]).astype(object).to_numpy()
        step = np.where(on_dev, dev_step, step)
        phase = np.where(on_dev, dev_phase, phase)
    ranges["step"] = step
    ranges["phase"] = [None if pd.isna(p) else p for p in phase]


def _ops(raw: RawTrace, attr: _Attribution) -> pd.DataFrame:
    ops = raw.ops.drop(columns=["external_id"])  # needed for linking kernels only
    ops["self_us"], ops["depth"] = self_times(ops)
    labels = attr.label(ops["start_us"].to_numpy())
    for col in list(labels):  # one label column at a time, compacted as it lands
        ops[col] = labels.pop(col)
        _compact_labels(ops, col)
    return ops


# Columns with a handful of distinct values: categorical (1 byte a row instead of 8; a multi-GB
# trace holds millions of ops). They compare, group and map like the object columns they were.
# (pid and tid stay objects: code grouping by thread, roofline's among it, expects their values.)
_FEW_VALUES = ("phase", "phase_range", "attention")


def _compact_labels(df: pd.DataFrame, *columns: str) -> pd.DataFrame:
    """`df` with its few-valued columns (those of `columns`, default all) categorical and its
    step int32."""
    for col in columns or (*_FEW_VALUES, "step"):
        if col == "step" and col in df:
            df[col] = df[col].astype(np.int32)
        elif col in _FEW_VALUES and col in df:
            df[col] = pd.Categorical(df[col].to_numpy(dtype=object))
    return df


def _kernels(raw: RawTrace, attr: _Attribution) -> pd.DataFrame:
    """Device activities placed by their launch: the runtime or driver call with the same
    correlation id, whatever its name; where the trace lacks it, the cpu_op with the activity's
    "External id" stands in (docs/commands/profile.md, "How a trace is read"). launch_via says
    which: "correlation", "external id", or None (unattributed)."""
    k = raw.device
    # The launch: one per correlation id (keep the first should a runtime call and a driver
    # call ever share one).
    launches = raw.launches
    first = launches.dropna(subset=["correlation"]).drop_duplicates("correlation")
    link = first.set_index("correlation")[["name", "tid", "start_us", "end_us"]]
    link.columns = ["launch_name", "launch_tid", "launch_us", "launch_end_us"]
    k = k.join(link, on="correlation")
    via = np.where(k["launch_us"].notna().to_numpy(), "correlation", None).astype(object)
    missing = pd.isna(via) & k["external_id"].notna().to_numpy()
    if missing.any() and len(raw.ops):
        ops = raw.ops.dropna(subset=["external_id"]).drop_duplicates("external_id")
        op = ops.set_index("external_id")[["name", "tid", "start_us", "end_us"]]
        found = k.loc[missing, ["external_id"]].join(op, on="external_id")
        hit = found["start_us"].notna().to_numpy()
        rows = np.flatnonzero(missing)[hit]
        k["launch_name"] = k["launch_name"].astype(object)
        for col, src in (("launch_name", "name"), ("launch_tid", "tid"), ("launch_us", "start_us"),
                         ("launch_end_us", "end_us")):
            k.iloc[rows, k.columns.get_loc(col)] = found[src].to_numpy()[hit]
        via[rows] = "external id"
    k["launch_via"] = via
    if pd.api.types.is_float_dtype(k["launch_tid"]):  # ints turned float by missing launches
        k["launch_tid"] = k["launch_tid"].astype("Int64")
    found = k["launch_us"].notna().to_numpy()
    labels = attr.label(k["launch_us"].fillna(-np.inf).to_numpy())
    for col, values in labels.items():
        k[col] = values
    for col in ("phase", "phase_range"):
        k[col] = np.where(found, k[col], UNATTRIBUTED)
    return _compact_labels(k)


def load_trace(path: str | Path) -> Trace:
    """Parse a Chrome trace JSON (optionally .gz) written by `prof.export_chrome_trace`.

    Raises TraceFormatError when the file is missing, unreadable, has no `traceEvents` list,
    or holds events that are not Chrome trace events (no numeric ts, not objects, ...).
    """
    path = Path(path)
    raw = read_trace(path)
    try:
        return _parse(path, raw)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a malformed event
        raise TraceFormatError(f"{path} is not a torch.profiler trace: {type(exc).__name__}: "
                               f"{exc}") from None


def _parse(path: Path, raw: RawTrace) -> Trace:
    ranges = _ranges(raw)
    host = ranges[~ranges["on_device"]]
    autograd = phase_names.autograd_threads(raw.thread_names)
    candidates = phase_names.marker_candidates(raw.ops, autograd)
    cols = ["start_us", "end_us"]
    marker_events = pd.concat([raw.ops.loc[candidates, cols].assign(cat="cpu_op"),
                               raw.modules[cols + ["cat"]]])
    marks = phase_names.markers(host, marker_events)
    del marker_events, candidates
    # Lookups merge each label's intervals anyway (`intervals.first_containing`): merged once
    # here, the markers of a multi-GB trace (every op of backward) cost a few rows, not millions.
    marks = phase_names.compact(marks)
    steps = _Steps.of(host)
    attr = _Attribution(host, marks, steps)
    _place_ranges(ranges, attr)

    kernels = _kernels(raw, attr)
    meta = raw.meta
    devices = meta.get("deviceProperties") if isinstance(meta.get("deviceProperties"), list) else []
    return Trace(
        path=str(path),
        ranges=ranges,
        ops=_ops(raw, attr),
        kernels=kernels,
        n_steps=len(steps),
        device_type="cuda" if len(kernels) else "cpu",
        device_names=[str(d.get("name")) for d in devices if isinstance(d, dict) and "name" in d],
    )
