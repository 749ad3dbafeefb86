"""What a running job has finished so far, for the row the launcher writes if the job is killed.

A job that runs past `--timeout` (or crashes) leaves no record of its own; its row is made by
the parent. So that the row can say how far the job got and what the finished part measured,
a runner calls `beat(...)` as it goes (e.g. after each timed step); the launcher points
`LMPERF_PROGRESS` at a file in the job's folder and reads it back when it kills the job. The
file is replaced atomically, so a kill mid-write leaves the previous beat. Outside a launched
child (inline, notebooks) `beat` does nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

ENV = "LMPERF_PROGRESS"


def beat(**fields: object) -> None:
    """Record the job's progress so far (JSON-ready values: e.g. stage, steps_done, steps,
    samples_ms). Costs one small file write; call it outside timed regions."""
    path = os.environ.get(ENV)
    if not path:
        return
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(fields, f)
        os.replace(tmp, path)
    except (OSError, TypeError, ValueError):  # progress is best effort, never the job's failure
        pass


def read(path: Path) -> dict | None:
    """The last beat written to `path`, or None when the job wrote none."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def describe(progress: dict | None) -> str:
    """A clause for a failed row's message: how far the job got ("" when unknown)."""
    if not progress:
        return ""
    done, total = progress.get("steps_done"), progress.get("steps")
    where = f" in {progress['stage']}" if progress.get("stage") else ""
    if isinstance(done, int) and isinstance(total, int):
        return f"; {done} of {total} steps had finished{where}"
    return f"; it was{where}" if where else ""
