"""`lmperf.bench(...)`: time forward, backward and the optimizer step over a grid; a Report."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from lmperf.bench.plan import plan_bench
from lmperf.bench.report import build_report
from lmperf.core.command import err, sweep_options
from lmperf.core.report import Report
from lmperf.core.sweep import run_sweep
from lmperf.model.presets import DEFAULT_COURSE


def bench(size: Sequence[str] | str | None = None, *, model: str | None = None,
          context: Sequence[int] | int | None = None, batch: Sequence[int] | int = 4,
          precision: Sequence[str] | str | None = None,
          mode: Sequence[str] | str = "train-step", attention: Sequence[str] | str = "naive",
          warmup: Sequence[int] | int = 5, steps: int = 10, seed: int = 0,
          optimizer: str = "auto", device: str = "auto", threads: int | None = None,
          model_context: int = 0, clip: float = 1.0, course: str = DEFAULT_COURSE,
          out: str | Path | None = None,
          inline: bool = False, timeout: float | None = None,
          max_memory_gib: float | None = None, resume: bool = False,
          progress: bool = False) -> Report:
    """Benchmark the reference LM (or `model`, "package.module:factory") over the cartesian
    product of every list argument; each run in its own child process unless `inline`.

    Keywords and defaults are `lmperf bench`'s flags (None: the device's default, see
    core.vocabulary.DEFAULTS), except `out`: None keeps the records in memory (the CLI writes
    results/bench.jsonl). Failed runs (oom, error, unsupported) are rows of the Report.
    Raises SpecError / ModelLoadError before anything runs for bad input, SweepInterrupted on
    Ctrl-C (finished rows are kept in `out`).
    """
    plan = plan_bench(size=size, model=model, context=context, batch=batch, precision=precision,
                      mode=mode, attention=attention, warmup=warmup, steps=steps, seed=seed,
                      optimizer=optimizer, device=device, threads=threads,
                      model_context=model_context, clip=clip, course=course)
    options = sweep_options(inline=inline, timeout=timeout, max_memory_gib=max_memory_gib,
                            resume=resume, progress=progress)
    if progress:
        for note in plan.notes:
            err(f"note: {note}")
        for warning in plan.warnings:
            err(f"warning: {warning}")
    return build_report(run_sweep(plan.specs, out, options))
