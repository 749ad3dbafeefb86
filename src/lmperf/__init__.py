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

Each name is the question's package, made callable (see `lmperf._callable`).
"""

__version__ = "0.1.0"

from lmperf import (  # noqa: E402  (callable packages)
    amp, attention, bench, compare, dist, doctor, memory, profile, report, train,
)

__all__ = ["Report", "amp", "attention", "bench", "compare", "dist", "doctor", "memory",
           "profile", "report", "train", "__version__"]


def __getattr__(name: str) -> object:
    # Report imports pandas: loaded on first use, so `import lmperf` (and `lmperf --help`) stays fast.
    if name == "Report":
        from lmperf.core.report import Report

        return Report
    raise AttributeError(f"module 'lmperf' has no attribute {name!r}")
