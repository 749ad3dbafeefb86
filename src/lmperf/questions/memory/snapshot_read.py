"""Reading CUDA memory snapshots on any machine (no GPU needed): load safely, parse once into
tables, summarise, plot. Recording them is `snapshot_record`.

A snapshot is the pickle `torch.cuda.memory._dump_snapshot` writes (`segments`, and
`device_traces` of alloc/free history). Active memory follows memory_viz's Active Memory
Timeline: a tensor counts from its `alloc` to its `free_completed`, those allocated before
recording from the start. The format and the rules: docs/commands/memory.md, "Reading a CUDA
memory snapshot".
"""

from __future__ import annotations

import builtins
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from lmperf.errors import SnapshotFormatError
from lmperf.units import MIB

SNAPSHOT_KEYS: tuple[str, ...] = ("segments", "device_traces")
TOP_ALLOCATIONS = 10
TOP_FRAMES = 3


# --- loading (any machine) --------------------------------------------------------------------------

class _RefusedGlobal(Exception):
    def __init__(self, module: str, name: str):
        super().__init__(f"{module}.{name}")
        self.module, self.name = module, name


class _SnapshotUnpickler(pickle.Unpickler):
    """An unpickler that builds builtin containers and primitives only.

    Dicts, lists, tuples, str, bytes, int, float, bool and None have their own pickle opcodes
    and never reach `find_class`; only sets need a global. Any other global (a class, or a
    callable such as os.system that a malicious pickle would call) is refused before it is
    looked up, so nothing from the file is executed.
    """

    _ALLOWED = frozenset({("builtins", "set"), ("builtins", "frozenset")})

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED:
            return getattr(builtins, name)
        raise _RefusedGlobal(module, name)

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids are not part of a memory snapshot")


def load_snapshot(path: str | Path) -> dict:
    """Read a CUDA memory snapshot pickle (as written by `torch.cuda.memory._dump_snapshot`).

    SECURITY: unpickling can execute code. This reader uses a restricted unpickler that builds
    only builtin containers and primitives and refuses every other global, so a file that would
    import or call anything (e.g. os.system) is rejected without running it.

    Returns the snapshot dict. Raises SnapshotFormatError when the file is missing, is not a
    pickle, holds a refused object, or is not a snapshot (lacks `segments` / `device_traces`).
    """
    path = Path(path)
    if not path.is_file():
        raise SnapshotFormatError(f"snapshot file not found: {path}" if not path.exists()
                                  else f"{path} is not a file")
    try:
        with open(path, "rb") as f:
            data = _SnapshotUnpickler(f).load()
    except _RefusedGlobal as exc:
        raise SnapshotFormatError(
            f"{path}: refused to unpickle {exc}: a memory snapshot holds only dicts, lists, "
            "strings and numbers, and loading other objects would run code from the file") from None
    except Exception as exc:  # any failure of the unpickler means: not a (valid) pickle
        raise SnapshotFormatError(f"{path} is not a pickle file ({type(exc).__name__}: {exc}); "
                                  "expected the file torch.cuda.memory._dump_snapshot writes") from None
    _check_format(path, data)
    return data


def _check_format(path: Path, data: object) -> None:
    expected = (f"expected a dict with keys {', '.join(repr(k) for k in SNAPSHOT_KEYS)} as "
                "written by torch.cuda.memory._dump_snapshot")
    if isinstance(data, list):
        raise SnapshotFormatError(
            f"unknown snapshot format in {path}: a pickled list (torch.cuda.memory_snapshot() "
            f"gives segments only, without allocation history); {expected}")
    if not isinstance(data, dict):
        raise SnapshotFormatError(f"unknown snapshot format in {path}: a pickled "
                                  f"{type(data).__name__}; {expected}")
    missing = [k for k in SNAPSHOT_KEYS if k not in data]
    if missing:
        found = ", ".join(repr(k) for k in list(data)[:8]) or "none"
        raise SnapshotFormatError(f"unknown snapshot format in {path}: missing "
                                  f"{', '.join(repr(k) for k in missing)}; {expected} "
                                  f"(found keys: {found})")
    segments, traces = data["segments"], data["device_traces"]
    if not isinstance(segments, list) or not all(
            isinstance(s, dict) and {"total_size", "blocks"} <= s.keys() for s in segments):
        raise SnapshotFormatError(f"unknown snapshot format in {path}: 'segments' must be a list "
                                  "of dicts with 'total_size' and 'blocks'")
    if not isinstance(traces, list) or not all(
            isinstance(t, list) and all(isinstance(e, dict) and "action" in e for e in t)
            for t in traces):
        raise SnapshotFormatError(f"unknown snapshot format in {path}: 'device_traces' must be a "
                                  "list (one per device) of lists of dicts with an 'action'")


# --- analysis: parse once into tables, then ask -----------------------------------------------------

# Frames to skip when naming who allocated: torch's own Python code (under a torch/ package
# directory) and native frames (C/C++/CUDA sources, or '??' when no debug info); when a stack has
# nothing else, what memory_viz itself hides (torch.cuda._memory_viz._frame_filter) and the
# allocator's own frames (innermost in every stack, never the answer).
_NATIVE_FILE = re.compile(r"(\.(c|cc|cpp|cxx|cu|cuh|h|hpp)$)|^\?\?$|^$")
_TORCH_FILE = re.compile(r"(^|[/\\])torch[/\\]")
NO_STACK = "<no stack: allocated before recording, or recorded without context>"


def format_frame(frame: dict) -> str:
    """'file.py:LINE name' (file name without its directories, as memory_viz shows it)."""
    filename = str(frame.get("filename", "??")).replace("\\", "/").split("/")[-1]
    return f"{filename}:{frame.get('line', 0)} {frame.get('name', '?')}"


def top_frames(frames: list[dict], n: int = TOP_FRAMES) -> list[str]:
    """The `n` innermost frames outside torch and native code, formatted; when a stack has none
    (e.g. the autograd engine thread, which has no Python frames), the innermost native frames
    other than the allocator's own and those memory_viz hides."""
    def user(f: dict) -> bool:
        name = str(f.get("filename", ""))
        return not _NATIVE_FILE.search(name) and not _TORCH_FILE.search(name)

    def shown(f: dict) -> bool:
        from torch.cuda._memory_viz import _frame_filter

        name = str(f.get("name", ""))
        return "CachingAllocator" not in name and _frame_filter(name, str(f.get("filename", "")))

    picked = [f for f in frames if user(f)] or [f for f in frames if shown(f)]
    return [format_frame(f) for f in picked[:n]]


def pick_device(snapshot: dict) -> int:
    """The device with the most history events (the lowest such index; else the first device
    that has a segment; else 0)."""
    traces = snapshot["device_traces"]
    if traces and max(len(t) for t in traces) > 0:
        return max(range(len(traces)), key=lambda i: (len(traces[i]), -i))
    devices = sorted({int(s.get("device", 0)) for s in snapshot["segments"]})
    return devices[0] if devices else 0


def _segments_on(snapshot: dict, device: int) -> list[dict]:
    return [s for s in snapshot["segments"] if int(s.get("device", 0)) == device]


def _trace_on(snapshot: dict, device: int) -> list[dict]:
    traces = snapshot["device_traces"]
    return traces[device] if 0 <= device < len(traces) else []


def _block_addresses(segment: dict) -> list[tuple[int, dict]]:
    """(address, block) for each block; older snapshots have no block 'address', and blocks
    tile their segment in order (Module.cpp: address += size)."""
    out, addr = [], int(segment.get("address", 0))
    for b in segment["blocks"]:
        out.append((int(b.get("address", addr)), b))
        addr += int(b["size"])
    return out


def allocations(snapshot: dict, device: int) -> pd.DataFrame:
    """One row per tensor allocation seen on `device`, in order of allocation.

    Columns: addr, size_bytes (requested), alloc_event (index in the device trace; -1 when it
    was allocated before recording started), free_event (its free_completed; <NA> when still
    live at the dump), source ('trace' or 'before recording'), stack ('alloc' or 'free': whose
    stack `frames` is; the free's when only the free was recorded), frames (innermost first).
    """
    rows: list[dict] = []
    live: dict[int, int] = {}  # addr -> row of an allocation not yet free_completed
    for i, e in enumerate(_trace_on(snapshot, device)):
        action = e["action"]
        if action == "alloc":
            live[int(e["addr"])] = len(rows)
            rows.append({"addr": int(e["addr"]), "size_bytes": int(e["size"]), "alloc_event": i,
                         "free_event": None, "source": "trace", "stack": "alloc",
                         "frames": e.get("frames", [])})
        elif action == "free_completed":
            row = live.pop(int(e["addr"]), None)
            if row is not None:
                rows[row]["free_event"] = i
            else:  # allocated before recording (or before the ring buffer's oldest entry)
                rows.append({"addr": int(e["addr"]), "size_bytes": int(e["size"]),
                             "alloc_event": -1, "free_event": i, "source": "before recording",
                             "stack": "free", "frames": e.get("frames", [])})
    for seg in _segments_on(snapshot, device):
        for addr, b in _block_addresses(seg):
            if b.get("state") == "active_allocated" and addr not in live:
                rows.append({"addr": addr, "size_bytes": int(b.get("requested_size") or b["size"]),
                             "alloc_event": -1, "free_event": None, "source": "before recording",
                             "stack": "alloc", "frames": b.get("frames", [])})
    df = pd.DataFrame(rows, columns=["addr", "size_bytes", "alloc_event", "free_event", "source",
                                     "stack", "frames"])
    df["free_event"] = df["free_event"].astype("Int64")
    return df


def active_timeline(snapshot: dict, device: int, allocs: pd.DataFrame) -> pd.DataFrame:
    """Active and reserved memory after each history event of `device` (`allocs`: its
    `allocations`).

    One row per event plus a first row `event = -1` for the state when recording started.
    Columns: event, action, size_bytes, time_us (<NA> where absent), active_bytes (tensors
    allocated and not yet free_completed), reserved_bytes (the allocator's segments: the dump's
    total minus the segment_alloc/map and plus the segment_free/unmap seen in the trace, replayed).
    """
    trace = _trace_on(snapshot, device)
    baseline = int(allocs.loc[allocs["alloc_event"] == -1, "size_bytes"].sum())
    delta_active, delta_reserved = [], []
    for e in trace:
        action, size = e["action"], int(e.get("size", 0))
        delta_active.append(size if action == "alloc" else -size if action == "free_completed" else 0)
        delta_reserved.append(size if action in ("segment_alloc", "segment_map")
                              else -size if action in ("segment_free", "segment_unmap") else 0)
    reserved_end = sum(int(s["total_size"]) for s in _segments_on(snapshot, device))
    reserved_start = reserved_end - sum(delta_reserved)
    return pd.DataFrame({
        "event": range(-1, len(trace)),
        "action": ["start"] + [e["action"] for e in trace],
        "size_bytes": [0] + [int(e.get("size", 0)) for e in trace],
        "time_us": pd.array([None] + [e.get("time_us") for e in trace], dtype="Int64"),
        "active_bytes": pd.Series([0] + delta_active).cumsum() + baseline,
        "reserved_bytes": pd.Series([0] + delta_reserved).cumsum() + reserved_start,
    })


@dataclass
class SnapshotSummary:
    """What a snapshot says about one device, as tables and numbers (bytes unless _mib).

    peak_event: trace index after which active memory peaks (-1: before the first event).
    peak_time_ms: that moment, in ms after the first event (None without time stamps).
    baseline_bytes: active memory allocated before recording started.
    reserved_bytes, allocated_bytes: the segments' totals at the dump (`total_size`,
    `allocated_size`: rounded block sizes, so allocated >= the active requested bytes).
    """

    path: Path
    device: int
    events: int
    peak_active_bytes: int
    peak_event: int
    peak_time_ms: float | None
    baseline_bytes: int
    reserved_bytes: int
    allocated_bytes: int
    segments: int
    ooms: int
    timeline: pd.DataFrame
    allocations: pd.DataFrame
    summary: pd.DataFrame
    largest: pd.DataFrame
    png: Path | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def tables(self) -> list[tuple[str, pd.DataFrame]]:
        """(title, table) pairs for the terminal / Markdown / LaTeX renderers."""
        return [(f"memory snapshot: {self.path.name} (cuda:{self.device})", self.summary),
                (f"largest allocations (top {len(self.largest)})", self.largest)]


def largest_allocations(allocs: pd.DataFrame, top: int = TOP_ALLOCATIONS) -> pd.DataFrame:
    """The `top` largest allocations (ties: earlier first) with the top frames of their stacks.

    Columns: size_mib, alloc_event (-1: before recording), free_event (<NA>: live at the dump),
    source, top_frames ('; '-joined, innermost first; 'freed by: ...' when only the free's stack
    was recorded).
    """
    df = allocs.sort_values(["size_bytes", "alloc_event"], ascending=[False, True], kind="stable")
    df = df.head(top)
    return pd.DataFrame({
        "size_mib": df["size_bytes"] / MIB,
        "alloc_event": df["alloc_event"],
        "free_event": df["free_event"],
        "source": df["source"],
        "top_frames": [_stack_text(frames, stack) for frames, stack in zip(df["frames"], df["stack"])],
    }).reset_index(drop=True)


def _stack_text(frames: list[dict], stack: str) -> str:
    text = "; ".join(top_frames(frames))
    if not text:
        return NO_STACK
    return f"freed by: {text}" if stack == "free" else text


def summarize_snapshot(path: str | Path, out_png: str | Path | None = None) -> SnapshotSummary:
    """Summarise a snapshot file without a browser (see the module docstring for the rules): the
    CUDA device with the most history events; `out_png`: where to draw active (and reserved)
    memory over the events, if given.
    """
    path = Path(path)
    snap = load_snapshot(path)
    device = pick_device(snap)
    try:
        allocs = allocations(snap, device)
        timeline = active_timeline(snap, device, allocs)
    except (KeyError, TypeError, ValueError) as exc:
        raise SnapshotFormatError(f"unknown snapshot format in {path}: an entry lacks or "
                                  f"mistypes {exc}") from None
    segs = _segments_on(snap, device)
    peak_row = timeline.loc[timeline["active_bytes"].idxmax()]
    times = timeline["time_us"].dropna()
    peak_time_ms = (None if pd.isna(peak_row["time_us"]) or times.empty
                    else (int(peak_row["time_us"]) - int(times.iloc[0])) / 1e3)
    events = len(timeline) - 1
    ooms = int((timeline["action"] == "oom").sum())
    s = SnapshotSummary(
        path=path, device=device, events=events,
        peak_active_bytes=int(peak_row["active_bytes"]), peak_event=int(peak_row["event"]),
        peak_time_ms=peak_time_ms,
        baseline_bytes=int(timeline["active_bytes"].iloc[0]),
        reserved_bytes=sum(int(x["total_size"]) for x in segs),
        allocated_bytes=sum(int(x.get("allocated_size", 0)) for x in segs),
        segments=len(segs), ooms=ooms, timeline=timeline, allocations=allocs,
        summary=pd.DataFrame(), largest=largest_allocations(allocs))
    s.summary = pd.DataFrame([{
        "device": f"cuda:{device}", "events": events,
        "peak_active_mib": s.peak_active_bytes / MIB, "peak_at_event": s.peak_event,
        "peak_at_ms": peak_time_ms, "before_recording_mib": s.baseline_bytes / MIB,
        "reserved_mib": s.reserved_bytes / MIB, "allocated_mib": s.allocated_bytes / MIB,
        "segments": s.segments, "ooms": ooms,
    }])
    if events == 0:
        s.notes.append("the snapshot has no allocation history (recorded without "
                       "_record_memory_history?): only the state at the dump is summarised")
    if ooms:
        s.notes.append(f"the allocator ran out of memory {ooms} time(s) in this history")
    if out_png is not None:
        s.png = plot_active_memory(s, out_png)
    return s


def plot_active_memory(summary: SnapshotSummary, path: str | Path) -> Path:
    """Draw active and reserved MiB over the history events to `path` (PNG); returns the path."""
    from matplotlib.figure import Figure  # no pyplot: no global figure state, no backend switch
    from matplotlib.ticker import MaxNLocator

    t = summary.timeline
    fig = Figure(figsize=(9, 4.5), layout="constrained")
    ax = fig.subplots()
    ax.step(t["event"], t["reserved_bytes"] / MIB, where="post", color="grey", linestyle="--",
            label="reserved (segments)")
    ax.step(t["event"], t["active_bytes"] / MIB, where="post", label="active (allocated tensors)")
    ax.plot([summary.peak_event], [summary.peak_active_bytes / MIB], "o", color="red",
            label=f"peak {summary.peak_active_bytes / MIB:.1f} MiB at event {summary.peak_event}")
    for x in t.loc[t["action"] == "oom", "event"]:
        ax.axvline(x, color="red", linewidth=0.8, label="out of memory")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))  # one legend entry however many OOM lines
    fig.legend(unique.values(), unique.keys(), fontsize=8, loc="outside lower center", ncols=4)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("allocator event # (-1: when recording started)")
    ax.set_ylabel("MiB")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{summary.path.name}: CUDA memory over the recorded history (cuda:{summary.device})")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
