"""Append-only JSONL results files: one record per line, flushed and fsynced as it is written."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Sequence

from lmperf.errors import ResultsFileError
from lmperf.results.record import migrate, problem, spec_key  # noqa: F401 (spec_key: here too)


def ensure_folder(path: Path, what: str = "plot folder") -> Path:
    """Create folder `path` (and its parents) before anything runs; ResultsFileError naming
    `what` if it cannot be (e.g. a file of that name exists). Returns the path."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ResultsFileError(f"cannot create the {what} {path}: {exc.strerror or exc}") from None
    return path


def ensure_writable(path: Path) -> None:
    """Create the parent folder and check the file can be appended to; raises ResultsFileError,
    also for an existing file that is not lmperf JSONL (a CSV, a --json array, a report):
    records are never appended to another kind of file."""
    if path.is_file() and (why := _not_jsonl(path)) is not None:
        raise ResultsFileError(f"{path} exists and {why}: lmperf appends only to its own "
                               "results files (JSON lines); give --out a new file")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise ResultsFileError(f"cannot write results to {path}: {exc.strerror or exc}") from None
    if path.is_dir():
        raise ResultsFileError(f"cannot write results to {path}: it is a directory")


def _not_jsonl(path: Path) -> str | None:
    """Why an existing file is not an lmperf JSONL results file (its first line is read), or
    None when it is one (or empty)."""
    try:
        with open(path, "rb") as f:
            first = f.readline(1 << 20).strip()
        if first.startswith(b"["):
            return "is a JSON array (--json FILE)"
        if not first:
            return None
        why = problem(json.loads(first))
    except (OSError, ValueError):  # unreadable text, not JSON (UnicodeDecodeError included)
        if first.startswith(b'{"schema":') and b"\n" not in _head(path):
            return None  # lmperf's own file, its only record torn by an interrupted write
        return "line 1 is not JSON"
    return None if why is None else f"line 1 is {why}"


def _head(path: Path) -> bytes:
    """The first MiB of a file (to tell a torn single record from a foreign file)."""
    with open(path, "rb") as f:
        return f.read(1 << 20)


def results_files(paths: Sequence[str | Path]) -> list[Path]:
    """`paths` with each folder replaced by its *.jsonl files, sorted (what `lmperf report
    results/`, `table` and `compare` read); ResultsFileError for a folder without any."""
    files: list[Path] = []
    for path in map(Path, paths):
        if not path.is_dir():
            files.append(path)
            continue
        found = sorted(path.glob("*.jsonl"))
        if not found:
            raise ResultsFileError(f"folder {path} holds no *.jsonl results file")
        files += found
    return files


def append_record(path: Path, record: dict) -> None:
    """Append one record as one line, then flush and fsync so that an interruption loses nothing
    already reported. A single write() of the whole line keeps lines from interleaving."""
    line = json.dumps(record, allow_nan=False, separators=(",", ":")) + "\n"
    try:
        with open(path, "a+b") as f:
            if f.tell():
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":  # a torn last line (an interrupted write) stays its own
                    line = "\n" + line
            f.write(line.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise ResultsFileError(f"cannot write results to {path}: {exc.strerror or exc}") from None


def read_text(path: Path) -> str:
    """A results file's text; ResultsFileError (one line) when it is missing or unreadable."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ResultsFileError(f"results file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ResultsFileError(f"cannot read results file {path}: {exc}") from None


def is_json_array(text: str) -> bool:
    """Whether a results file's text is one JSON array (what every command's `--json FILE`
    writes) rather than JSON lines: a JSONL file's first character is a record's '{'."""
    return text.lstrip().startswith("[")


def read_json_array(path: Path, text: str | None = None) -> list[dict]:
    """The objects of a JSON array file (`--json FILE`), in order, each with a 'kind'; raises
    ResultsFileError naming the line of a syntax error or the item that is not an object."""
    text = read_text(path) if text is None else text
    try:
        items = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResultsFileError(f"{path} line {exc.lineno} is not valid JSON ({exc.msg}); "
                               "it looks like a JSON array (--json FILE): repair or rewrite it"
                               ) from None
    if not isinstance(items, list):
        raise ResultsFileError(f"{path} is not a JSON array of lmperf records")
    for i, item in enumerate(items, start=1):
        if not (isinstance(item, dict) and "kind" in item):
            raise ResultsFileError(f"{path} item {i} of its JSON array is not an lmperf record")
    return items


def read_records(path: Path) -> list[dict]:
    """All records of a results file, in order: JSON lines (--out), or one JSON array of
    records (--json FILE); raises ResultsFileError naming a corrupt line or item."""
    text = read_text(path)
    if is_json_array(text):
        items = read_json_array(path, text)
        for i, item in enumerate(items, start=1):
            why = problem(item)
            if why is not None:
                what = (" (lmperf compare's rows: `lmperf report` shows them)"
                        if item.get("kind") == "compare" else "")
                raise ResultsFileError(f"{path} item {i} of its JSON array is {why}{what}")
        return migrate(items)
    records = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            if line.startswith('{"schema":'):  # lmperf's own line, cut by an interrupted write
                print(f"lmperf: warning: {path} line {lineno} is a torn record (its write was "
                      "interrupted): left out", file=sys.stderr)
                continue
            raise ResultsFileError(
                f"{path} line {lineno} is not valid JSON ({exc.msg}); remove or repair that line"
            ) from None
        why = problem(obj)
        if why is not None:
            raise ResultsFileError(f"{path} line {lineno} is {why}")
        records.append(obj)
    return migrate(records)
