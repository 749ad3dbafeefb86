"""Stream a Chrome trace file into compact columns: traces of any size in bounded memory.

Events are read one at a time (`ijson` when installed, else the whole document by `json`) and
only the fields the analysis uses are appended to typed columns (names, pids, tids, devices and
streams interned; ts and dur float64): ~40-60 bytes per kept event, whatever the file's size.
The top-level fields (`deviceProperties`, `distributedInfo`) are read from the bytes before
`"traceEvents"`, where Kineto writes them. Details: docs/commands/profile.md, "How a trace is read".
"""

from __future__ import annotations

import gzip
import json
import sys
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterator

import numpy as np
import pandas as pd

from lmperf.errors import TraceFormatError

RANGE_CATS = ("user_annotation", "gpu_user_annotation")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
DEVICE_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
MODULE_PREFIX = "nn.Module: "
_MISSING = -(2 ** 63)  # an absent integer argument (read back as <NA>)
_HEADER_BYTES = 16 << 20  # how far into the file the header (deviceProperties, ...) is looked for
_CHUNK = 1 << 20
_WARN_BYTES = 64 << 20  # without ijson, a file this big is read whole with a warning


class _Interner:
    """Distinct values -> int codes, so that a column of repeated values costs 4 bytes a row."""

    def __init__(self) -> None:
        self.codes: dict = {}

    def __call__(self, value) -> int:
        return self.codes.setdefault(value, len(self.codes))

    def column(self, codes: array, as_str: bool = False) -> np.ndarray:
        """The object column of the values behind `codes` (shared references, 8 bytes a row);
        `as_str`: each value as a str (names)."""
        values = np.empty(len(self.codes), dtype=object)
        for value, code in self.codes.items():
            values[code] = str(value) if as_str else value
        return values[np.array(codes, dtype=np.int32)]


@dataclass
class _Table:
    """The typed columns of one kind of event, filled event by event."""

    extra_int: tuple[str, ...] = ()  # integer args (int64, missing -> <NA>)
    extra_code: tuple[str, ...] = ()  # other args, interned
    name: array = field(default_factory=lambda: array("i"))
    pid: array = field(default_factory=lambda: array("i"))
    tid: array = field(default_factory=lambda: array("i"))
    cat: array = field(default_factory=lambda: array("i"))
    ts: array = field(default_factory=lambda: array("d"))
    dur: array = field(default_factory=lambda: array("d"))
    ints: dict[str, array] = field(default_factory=dict)
    codes: dict[str, array] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ints = {k: array("q") for k in self.extra_int}
        self.codes = {k: array("i") for k in self.extra_code}

    def __len__(self) -> int:
        return len(self.ts)


@dataclass
class RawTrace:
    """What a trace file holds, as DataFrames (times in microseconds, as the file writes them).

    ranges: user_annotation and gpu_user_annotation events (name, pid, tid, start_us, end_us,
        dur_us, cat, external_id); ops: cpu_op events (the base columns and external_id); modules:
        python_function events named "nn.Module: ..." (a module's forward, a phase marker), with
        cat; launches: cuda_runtime / cuda_driver calls with cat and correlation; device:
        kernel / gpu_memcpy / gpu_memset with kind, device, stream, correlation, external_id (the
        "External id" of the cpu_op that launched it; device and
        stream fall back to pid and tid where the args lack them, as peer copies write
        "inDevice"). thread_names: (pid, tid) -> the name Kineto's thread_name metadata gives.
    meta: the document's other top-level fields found before the events.
    """

    ranges: pd.DataFrame
    ops: pd.DataFrame
    modules: pd.DataFrame
    launches: pd.DataFrame
    device: pd.DataFrame
    thread_names: dict[tuple, str]
    meta: dict
    n_events: int


def _open(path: Path) -> IO[bytes]:
    """The file's bytes, gunzipped when it starts with gzip's magic bytes (whatever its name)."""
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


def _header(path: Path) -> tuple[str, dict]:
    """(ijson prefix of the events, the top-level fields written before them)."""
    with _open(path) as f:
        head = b""
        while len(head) < _HEADER_BYTES:
            chunk = f.read(_CHUNK)
            if not chunk:
                break
            head += chunk
            at = head.find(b'"traceEvents"')
            if at >= 0:
                break
    text = head.lstrip()
    if text[:1] == b"[":
        return "item", {}
    at = head.find(b'"traceEvents"')
    if text[:1] != b"{" or at < 0:
        raise TraceFormatError(f"{path} is not a Chrome trace: no 'traceEvents' list")
    try:  # the header as a document of its own: "{...fields..., "traceEvents": []}"
        meta = json.loads(head[:at] + b'"traceEvents": []}')
    except ValueError:
        meta = {}
    meta.pop("traceEvents", None)
    return "traceEvents.item", meta if isinstance(meta, dict) else {}


def _events(f: IO[bytes], prefix: str) -> Iterator[dict]:
    """The events one at a time (ijson's fastest backend; floats, not Decimals), or without ijson
    those of the whole document read by `json`."""
    try:
        import ijson
    except ImportError:
        doc = json.load(f)
        return iter(doc if prefix == "item" else doc["traceEvents"])
    return ijson.items(f, prefix, use_float=True)


def _json_errors() -> tuple[type[Exception], ...]:
    """The exceptions a malformed document raises: the json module's, and ijson's if installed."""
    try:
        from ijson import JSONError
    except ImportError:
        return (json.JSONDecodeError,)
    return (json.JSONDecodeError, JSONError)


def read_trace(path: str | Path) -> RawTrace:
    """Stream the trace at `path` (.json, or gzipped whatever its name) into a RawTrace.

    Raises TraceFormatError for a missing, unreadable or truncated file, JSON that is not a Chrome
    trace (no `traceEvents` list, events that are not objects, an X event without a numeric ts).
    """
    path = Path(path)
    errors = _json_errors()
    if len(errors) == 1 and path.is_file() and path.stat().st_size > _WARN_BYTES:
        print(f"lmperf: warning: ijson is not installed: {path} ({path.stat().st_size >> 20} MB) "
              "is read whole, in 5-10x its size of memory (pip install ijson)", file=sys.stderr)
    try:
        prefix, meta = _header(path)
        with _open(path) as f:
            return _read(f, prefix, meta)
    except TraceFormatError:
        raise
    except (OSError, EOFError, *errors) as exc:  # missing, bad gzip, truncated JSON
        # yajl's messages point at the byte over three lines: the first says what is wrong.
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise TraceFormatError(f"cannot read trace {path}: {first}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise TraceFormatError(f"{path} is not a torch.profiler trace: {type(exc).__name__}: "
                               f"{exc}") from None


def _read(f: IO[bytes], prefix: str, meta: dict) -> RawTrace:
    names, ids, cats = _Interner(), _Interner(), _Interner()
    ranges = _Table(extra_int=("External id",))
    ops = _Table(extra_int=("External id",))
    modules = _Table()
    launches = _Table(extra_int=("correlation",))
    device = _Table(extra_int=("correlation", "External id"), extra_code=("device", "stream"))
    table_of = {**{c: ranges for c in RANGE_CATS}, "cpu_op": ops, "python_function": modules,
                **{c: launches for c in LAUNCH_CATS}, **{c: device for c in DEVICE_CATS}}
    thread_names: dict[tuple, str] = {}
    # The loop runs once per event (millions): dict lookups inlined, no method calls but appends.
    name_codes, id_codes, cat_codes = names.codes, ids.codes, cats.codes
    n_events = 0
    for e in _events(f, prefix):
        n_events += 1
        ph = e.get("ph")  # AttributeError (-> TraceFormatError) for an event that is no object
        if ph == "X":
            cat = e.get("cat", "")
            table = table_of.get(cat)
            if table is None:
                continue
            name = e.get("name", "")
            if table is modules and not str(name).startswith(MODULE_PREFIX):
                continue  # python stack frames: only module forwards mark a phase
            code = name_codes.get(name)
            if code is None:
                code = name_codes[name] = len(name_codes)
            table.name.append(code)
            pid, tid = e.get("pid"), e.get("tid")
            code = id_codes.get(pid)
            if code is None:
                code = id_codes[pid] = len(id_codes)
            table.pid.append(code)
            code = id_codes.get(tid)
            if code is None:
                code = id_codes[tid] = len(id_codes)
            table.tid.append(code)
            table.cat.append(cat_codes.setdefault(cat, len(cat_codes)))
            table.ts.append(float(e["ts"]))
            table.dur.append(float(e.get("dur", 0.0)))
            if table.ints:
                args = e.get("args") or {}
                for key, col in table.ints.items():
                    v = args.get(key)
                    col.append(_MISSING if v is None else int(v))
                if table is device:
                    dev, stream = args.get("device"), args.get("stream")
                    table.codes["device"].append(ids(pid if dev is None else dev))
                    table.codes["stream"].append(ids(tid if stream is None else stream))
        elif ph == "M" and e.get("name") == "thread_name":
            thread_names[(e.get("pid"), e.get("tid"))] = str((e.get("args") or {}).get("name", ""))
    frame = _Framer(names, ids, cats)
    ranges_df = frame(ranges)
    ranges_df = ranges_df.rename(columns={"External id": "external_id"})
    dev_df = frame(device).rename(columns={"External id": "external_id"})
    dev_df.insert(6, "kind", dev_df.pop("cat").map(DEVICE_CATS))
    ops_df = frame(ops, cat=False).rename(columns={"External id": "external_id"})
    return RawTrace(ranges=ranges_df, ops=ops_df, modules=frame(modules),
                    launches=frame(launches), device=dev_df, thread_names=thread_names,
                    meta=meta, n_events=n_events)


@dataclass
class _Framer:
    names: _Interner
    ids: _Interner
    cats: _Interner

    def __call__(self, t: _Table, cat: bool = True) -> pd.DataFrame:
        """The table as a DataFrame: name, pid, tid, start_us, end_us, dur_us[, cat], args."""
        start, dur = _floats(t.ts), _floats(t.dur)
        cols = {"name": self.names.column(t.name, as_str=True), "pid": self.ids.column(t.pid),
                "tid": self.ids.column(t.tid), "start_us": start, "end_us": start + dur,
                "dur_us": dur}
        if cat:
            cols["cat"] = self.cats.column(t.cat)
        for key, col in t.ints.items():
            v = np.array(col, dtype=np.int64)  # a copy: the array is emptied below
            cols[key] = pd.arrays.IntegerArray(v, v == _MISSING)
        for key, col in t.codes.items():
            cols[key] = self.ids.column(col)
        # Free the arrays as soon as their frame exists: the peak is one copy, not two.
        for a in (t.name, t.pid, t.tid, t.cat, t.ts, t.dur, *t.ints.values(), *t.codes.values()):
            del a[:]
        return pd.DataFrame(cols)


def _floats(col: array) -> np.ndarray:
    """A float64 copy of a typed array (the array is emptied once its frame exists)."""
    return np.array(col, dtype=np.float64)
