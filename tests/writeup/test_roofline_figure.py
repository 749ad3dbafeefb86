"""The roofline figure of the write-up, drawn from what a profile record stores."""

from __future__ import annotations

import pandas as pd

from lmperf.runtime.ceilings import Ceilings
from lmperf.questions.profile import roofline as rl
from lmperf.questions.writeup.plots import plots_for
from lmperf.questions.profile.report import build_report
from lmperf.questions.writeup.roofline_figure import roofline_png
from lmperf.results.schema import to_jsonable


def _record(with_roofline: bool = True) -> dict:
    costs = pd.DataFrame([("forward", "aten::mm", "fp32", "matmul", 1, 4e9, 1e6, 1e6),
                          ("forward", "aten::mul", "fp32", "elementwise/norm", 2, 0, 3e6, 1e6)],
                         columns=["phase", "op", "dtype", "op_class", "calls", "flops",
                                  "bytes_read", "bytes_written"])
    measured = pd.DataFrame({"phase": ["forward"] * 2, "op": ["aten::mm", "aten::mul"],
                             "measured_ms": [50.0, 4.0], "calls": [1, 2]})
    ceilings = Ceilings("cpu", "cpu", 1, {"fp32": 1e11}, {"fp32": 512}, 1e10, 1.2e10, 1 << 20)
    per_op = rl.top_per_phase(rl.per_op_table(costs, measured, ceilings), 10)
    tables = {rl.PER_OP: per_op, rl.CEILINGS: rl.ceilings_table(ceilings)} if with_roofline \
        else {}
    spec = {"size": "tiny", "context": 32, "batch": 2, "precision": "fp32",
            "mode": "train-step", "attention": "naive"}
    return {"schema": 1, "kind": "profile", "status": "ok", "message": "", "spec": spec,
            "params": 1, "env": {}, "warnings": [],
            "metrics": {"tables": {t: to_jsonable(df.to_dict(orient="records"))
                                   for t, df in tables.items()}}}


def test_the_figure_is_drawn_from_the_stored_tables():
    data = roofline_png([_record()])
    assert data is not None and data.startswith(b"\x89PNG")
    assert roofline_png([_record(with_roofline=False)]) is None


def test_the_profile_section_has_the_roofline_plot():
    titles = {p.title: p for p in plots_for(build_report([_record()]))}
    plot = titles["roofline: operators as points sized by their measured time"]
    assert plot.png is not None
