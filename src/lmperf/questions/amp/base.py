"""The precision lab's common shape: an experiment is a plain function returning an
ExperimentResult (named tables + findings), which the CLI renders, records and plots.

An experiment module defines:
    NAME: str                  the subcommand name
    SUMMARY: str               one line for `lmperf amp`
    add_arguments(parser)      its own options (argparse), every one with a default
    check(device, **options)   SpecError for a bad option, before anything runs anywhere
    run(device, **options) -> ExperimentResult
                               options named like the argparse dests; pure: no printing, no files
    plot(result, path) -> None optional: a PNG of the result (matplotlib, Agg backend)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from lmperf.results.schema import to_jsonable


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
            "params": to_jsonable(self.params),
            "tables": {title: to_jsonable(df.to_dict(orient="records")) for title, df in self.tables},
            "notes": list(self.notes),
        }


def render(result: ExperimentResult, fmt: str = "text") -> str:
    """The result as text, Markdown, LaTeX or CSV: each table under its title, then the findings."""
    from lmperf.core.report import Report

    return Report(kind="amp", tables=dict(result.tables), findings=list(result.notes)).render(fmt)


def dtype_name(dtype: object) -> str:
    """'torch.bfloat16' -> 'bfloat16' (short names in tables)."""
    return str(dtype).replace("torch.", "")


def dtype_names(tensors: list) -> str:
    """Tensor dtypes in argument order, repeats dropped ('bfloat16, float32'); '-' if none."""
    return ", ".join(dict.fromkeys(dtype_name(t.dtype) for t in tensors)) or "-"


def finite(t: object) -> bool:
    """Whether every element of the tensor `t` is finite (a device sync)."""
    return bool(t.isfinite().all().item())


def shown(values: object) -> str:
    """Numbers as a flag's help shows its default: '0.0001 0.01 1'."""
    return " ".join(f"{v:g}" for v in values)


def max_rel_error(y: object, ref: object) -> float:
    """max |y - ref| / max |ref| over the whole tensors, in fp64 (inf/nan propagate)."""
    err = (y.double() - ref.double()).abs().max().item()
    scale = ref.double().abs().max().item()
    if scale == 0:  # an all-zero reference: any nonzero error is infinitely large
        return err if err == 0 or math.isnan(err) else math.inf
    return err / scale
