"""What a running job has finished so far, for the row the launcher writes if the job is killed
(past `--timeout`, or a crash): a runner calls `beat(...)` as it goes; the launcher points
`LMPERF_PROGRESS` at a file in the job's folder (replaced atomically: a kill mid-write leaves
the previous beat) and reads it back. Outside a launched child `beat` does nothing.
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
