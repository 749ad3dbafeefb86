"""Append-only JSONL results files: one record per line, flushed and fsynced as it is written."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

from lmperf.errors import ResultsFileError
from lmperf.results.schema import is_record


def spec_key(kind: str, spec: dict) -> str:
    """The identity of a run: its kind and spec as canonical JSON."""
    return json.dumps({"kind": kind, "spec": spec}, sort_keys=True, separators=(",", ":"))


def ensure_folder(path: Path, what: str = "plot folder") -> Path:
    """Create folder `path` (and its parents) before anything runs; ResultsFileError naming
    `what` if it cannot be (e.g. a file of that name exists). Returns the path."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ResultsFileError(f"cannot create the {what} {path}: {exc.strerror or exc}") from None
    return path


def ensure_writable(path: Path) -> None:
    """Create the parent folder and check the file can be appended to; raises ResultsFileError."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise ResultsFileError(f"cannot write results to {path}: {exc.strerror or exc}") from None
    if path.is_dir():
        raise ResultsFileError(f"cannot write results to {path}: it is a directory")


def append_record(path: Path, record: dict) -> None:
    """Append one record as one line, then flush and fsync so that an interruption loses nothing
    already reported. A single write() of the whole line keeps lines from interleaving."""
    line = json.dumps(record, allow_nan=False, separators=(",", ":")) + "\n"
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise ResultsFileError(f"cannot write results to {path}: {exc.strerror or exc}") from None


def read_records(path: Path) -> list[dict]:
    """All records of a results file, in order; raises ResultsFileError naming a corrupt line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ResultsFileError(f"results file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ResultsFileError(f"cannot read results file {path}: {exc}") from None
    records = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ResultsFileError(
                f"{path} line {lineno} is not valid JSON ({exc.msg}); remove or repair that line"
            ) from None
        if not is_record(obj):
            raise ResultsFileError(f"{path} line {lineno} is not an lmperf record")
        records.append(obj)
    return records


def finished_keys(records: Iterable[dict], statuses: tuple[str, ...] = ("ok",)) -> set[str]:
    """Keys of the runs whose status is in `statuses` (what `--resume` skips)."""
    return {spec_key(r["kind"], r["spec"]) for r in records if r["status"] in statuses}
