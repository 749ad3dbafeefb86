"""A profile's record for the results file, and its tables as text, Markdown or CSV files."""

from __future__ import annotations

import re
from pathlib import Path

from lmperf.errors import LmperfError
from lmperf.results.schema import make_record, to_jsonable
from lmperf.results.tables import render_sections
from lmperf.runtime import env as envmod

KIND = "profile"


def to_record(result) -> dict:
    """The `kind: "profile"` record: spec + backend, tables, findings, timings, trace path."""
    import torch

    spec = result.spec.to_dict() | {"backend": result.backend}
    metrics = {
        "trace_path": str(result.trace_path),
        "tables": {title: to_jsonable(df.to_dict(orient="records")) for title, df in result.tables},
        "notes": list(result.notes),
        "timings_s": dict(result.timings),
    }
    return make_record(KIND, spec, "ok", envmod.capture(torch.device(result.spec.device)),
                       metrics=metrics)


def render(result, fmt: str = "text") -> str:
    """Tables under their titles, then the findings (floats to 4 significant digits)."""
    return render_sections(result.tables, result.notes, fmt, digits=4)


def write_csv(result, folder: Path) -> list[Path]:
    """One CSV per table in `folder`, named after the table's title; returns the paths."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        paths = []
        for title, df in result.tables:
            path = folder / (re.sub(r"[^A-Za-z0-9]+", "_", title).strip("_")[:80] + ".csv")
            df.to_csv(path, index=False)
            paths.append(path)
    except OSError as exc:
        raise LmperfError(f"cannot write CSV tables to {folder}: {exc.strerror or exc}") from None
    return paths
