"""The precision lab's common shape: an experiment is a plain function returning an
ExperimentResult (named tables + findings), which the CLI renders, records and plots.

An experiment module defines:
    NAME: str                  the subcommand name
    SUMMARY: str               one line for `lmperf amp`
    add_arguments(parser)      its own options (argparse), every one with a default
    run(device, **options) -> ExperimentResult
                               options named like the argparse dests; pure: no printing, no files
    plot(result, path) -> None optional: a PNG of the result (matplotlib, Agg backend)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd


@dataclass
class ExperimentResult:
    """What an experiment found on this device and torch.

    Attributes:
        experiment: the experiment's NAME.
        params: the inputs it ran with (device, sizes, values...), JSON-ready.
        tables: (title, DataFrame) pairs, in reading order.
        notes: findings in sentences, each computed from the measured values (never pasted).
    """

    experiment: str
    params: dict
    tables: list[tuple[str, pd.DataFrame]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def table(self, title: str) -> pd.DataFrame:
        """The table with this title; raises KeyError naming the titles there are."""
        for t, df in self.tables:
            if t == title:
                return df
        raise KeyError(f"no table {title!r}; tables: {[t for t, _ in self.tables]}")

    def to_dict(self) -> dict:
        """JSON-ready: tables as lists of row dicts; inf/nan as the strings 'inf', '-inf', 'nan'."""
        return {
            "experiment": self.experiment,
            "params": _jsonable(self.params),
            "tables": {title: _jsonable(df.to_dict(orient="records")) for title, df in self.tables},
            "notes": list(self.notes),
        }


def _jsonable(obj: object) -> object:
    """Plain JSON types: numpy scalars unwrapped, non-finite floats as strings, dtypes as names."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        try:
            obj = obj.item()  # numpy / torch scalars
        except (ValueError, TypeError, RuntimeError):
            return str(obj)
    if isinstance(obj, float):
        if math.isnan(obj):
            return "nan"
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
        return obj
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    return str(obj)  # torch.dtype, torch.device, ...


def render(result: ExperimentResult, fmt: str = "text") -> str:
    """The result as text or Markdown: each table under its title, then the findings."""
    if fmt not in ("text", "markdown"):
        raise ValueError(f"unknown format {fmt!r}; accepted: text, markdown")
    parts = []
    for title, df in result.tables:
        if fmt == "markdown":
            parts.append(f"#### {title}\n\n{df.to_markdown(index=False)}\n")
        else:
            parts.append(f"{title}\n{df.to_string(index=False)}\n")
    if result.notes:
        bullet = "- " if fmt == "markdown" else "* "
        parts.append("\n".join(bullet + n for n in result.notes) + "\n")
    return "\n".join(parts)


def dtype_name(dtype: object) -> str:
    """'torch.bfloat16' -> 'bfloat16' (short names in tables)."""
    return str(dtype).replace("torch.", "")
