"""`lmperf.train(...)`: train the reference LM once per precision regime; a Report."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from lmperf.core.command import err, sweep_options
from lmperf.core.report import Report
from lmperf.core.sweep import run_sweep
from lmperf.model.presets import DEFAULT_COURSE
from lmperf.results.store import ensure_folder
from lmperf.questions.train.plan import plan_train
from lmperf.questions.train.report import build_report

PLOT_NAME = "train.png"


def train(size: str | None = None, *, precision: Sequence[str] | str | None = None,
          context: int | None = None, batch: int | None = None, steps: int | None = None,
          lr: float = 3e-3, lr_warmup: int = 20, clip: float = 1.0, eps: float = 1e-8,
          eval_interval: int = 50, eval_batches: int = 8, seed: int = 0,
          data: str | Path | None = None, tokens: str | Path | None = None,
          vocab_size: int | None = None, attention: str = "naive", device: str = "auto",
          threads: int | None = None, course: str = DEFAULT_COURSE,
          compile: Sequence[bool] | bool = False, compile_mode: str = "default",
          float8: Sequence[str] | str = "none", plots: str | Path | None = None,
          out: str | Path | None = None, inline: bool = False, timeout: float | None = None,
          max_memory_gib: float | None = None, resume: bool = False,
          progress: bool = False) -> Report:
    """Train the reference LM of preset `size` once per regime in `precision`, from the same
    seed on the same batches; each regime is one job, in its own child process unless `inline`.
    `float8` (several: an axis) trains a bf16 regime again with torchao's float8 Linear layers
    ('tensorwise', 'rowwise'), its curve read against the regime's own.

    Keywords and defaults are `lmperf train`'s flags (None: the device's default, see
    core.vocabulary.DEFAULTS["train"]), except `out` (None keeps the records in memory; the CLI
    writes results/train.jsonl) and `plots` (a folder for train.png; None draws nothing).
    A regime whose loss turns NaN or diverges stops there with that outcome recorded; failed
    jobs (oom, error, unsupported) are rows of the Report. Raises SpecError before anything runs
    for bad input (including a bad data file), SweepInterrupted on Ctrl-C.
    """
    plan = plan_train(size=size, precision=precision, context=context, batch=batch, steps=steps,
                      lr=lr, lr_warmup=lr_warmup, clip=clip, eps=eps,
                      eval_interval=eval_interval, eval_batches=eval_batches, seed=seed,
                      data=data, tokens=tokens, vocab_size=vocab_size, attention=attention,
                      device=device, threads=threads, course=course, compile=compile,
                      compile_mode=compile_mode, float8=float8)
    options = sweep_options(inline=inline, timeout=timeout, max_memory_gib=max_memory_gib,
                            resume=resume, progress=progress)
    if plots is not None:
        ensure_folder(Path(plots))
    if progress:
        for line in [f"note: {n}" for n in plan.notes] + [f"warning: {w}" for w in plan.warnings]:
            err(line)
    report = build_report(run_sweep(plan.specs, out, options))
    if plots is not None and report.records:  # (--resume may leave nothing to draw)
        from lmperf.questions.train.plots import plot_records
        from lmperf.questions.train.report import caption

        path = plot_records(report.records, Path(plots) / PLOT_NAME,
                            caption(report.records, notes=False))
        if progress:
            err(f"plots: {path}")
    return report
