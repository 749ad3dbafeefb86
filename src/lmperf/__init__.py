"""lmperf: a performance lab for training Transformer language models in PyTorch.

One call per question, each returning a `Report` (`.frame`, `.tables`, `.findings`, `.records`),
with the CLI's keyword names and defaults (except `out=None`: records stay in memory)::

    import lmperf
    lmperf.bench(size="tiny", context=[64, 128], precision=["fp32", "bf16-mixed"]).frame
    lmperf.profile(size="tiny", mode="forward").tables
    lmperf.memory(size="tiny", context=[64, 128]).frame
    lmperf.amp("accumulate").frame
    lmperf.train(steps=20).frame
    lmperf.attention(attention=["naive", "sdpa"], context=[256]).frame
    lmperf.compare("base.jsonl", "new.jsonl").frame    # is it faster, really?
    lmperf.report(["results/bench.jsonl", "results/memory.jsonl"], out="report.html")
    lmperf.doctor()                       # does every path lmperf relies on work here?
    lmperf.dist("train", strategy=["naive", "overlap"])   # data parallelism under torchrun

The functions live in `lmperf.api` (real signatures: `help(lmperf.bench)`); the questions'
packages in `lmperf.questions`. Both are imported on first use, so `import lmperf` is cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ loads them lazily
    from lmperf.api import (amp, attention, bench, compare, dist, doctor, memory, plan, profile,
                            report, train)
    from lmperf.core.report import Report

__all__ = ["Report", "amp", "attention", "bench", "compare", "dist", "doctor", "memory", "plan",
           "profile", "report", "train", "__version__"]

_API = frozenset(__all__) - {"Report", "__version__"}


def __getattr__(name: str) -> object:
    # Loaded on first use so that `import lmperf` (and `lmperf --help`) imports neither torch nor pandas.
    if name in _API:
        from lmperf import api

        return getattr(api, name)
    if name == "Report":
        from lmperf.core.report import Report

        return Report
    raise AttributeError(f"module 'lmperf' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
