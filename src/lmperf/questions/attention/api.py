"""`lmperf.attention(...)`: attention implementations timed over sequence lengths; a Report."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from lmperf.questions.attention.report import build_report
from lmperf.questions.attention.spec import AttnSpec, plan_sweep
from lmperf.core import sweep as core_sweep
from lmperf.core.command import err, sweep_options
from lmperf.core.launch import failed_record
from lmperf.core.report import Report
from lmperf.core.vocabulary import as_list, resolve_threads
from lmperf.results.store import ensure_folder


def unsupported_record(spec: AttnSpec) -> dict | None:
    """An 'unsupported' record made in the parent (no child started: a dtype the registry
    lacks, flash-triton without a GPU or the interpreter), or None if `spec` can run."""
    import torch

    from lmperf import kernels
    from lmperf.questions.attention.job import TORCH_DTYPES, analytic_metrics

    reason = kernels.supports(spec.attention, torch.device(spec.device), TORCH_DTYPES[spec.dtype])
    if not reason:
        return None
    return failed_record(spec, "unsupported", reason, metrics={"analytic": analytic_metrics(spec)})


def run_sweep(specs: Sequence[AttnSpec], out: Path | None,
              options: core_sweep.SweepOptions | None = None) -> list[dict]:
    """Run `specs` as jobs of `lmperf.core.sweep.run_sweep` (unsupported ones as rows without a
    child), appending each record to `out` (None: in memory only); returns the records."""
    return core_sweep.run_sweep(specs, out, options, precheck=unsupported_record)


def attention(attention: Sequence[str] | str | None = None, *,
              context: Sequence[int] | int | None = None, suite: str = "flash",
              d: Sequence[int] | int | None = None, batch: int | None = None,
              heads: int | None = None, dtype: Sequence[str] | str | None = None,
              causal: bool | None = None, warmup: int = 2, steps: int = 5, seed: int = 0,
              device: str = "auto", threads: int | None = None,
              plots: str | Path | None = None, out: str | Path | None = None,
              inline: bool = False, timeout: float | None = None,
              max_memory_gib: float | None = None, resume: bool = False,
              progress: bool = False) -> Report:
    """Time attention implementations (forward, backward, both) and account for the memory each
    leaves for backward, over the product of implementations x context x d x precision; each
    configuration in its own child process unless `inline`.

    Keywords and defaults are `lmperf attention`'s flags: None takes the suite's value, scaled
    down on the CPU (`lmperf.questions.attention.spec.SUITES`); `dtype` is the dtype of q, k, v (fp32,
    bf16, fp16); `steps` timed calls after `warmup` untimed ones per pass; `threads` follows the
    shared policy (None: 1 on the CPU). `plots` writes the PNG plots into that folder.
    `out=None` keeps the records in memory (the CLI writes results/attention.jsonl).
    Out-of-memory, errors and unsupported combinations are rows of the Report. Raises SpecError
    before anything runs for bad input, SweepInterrupted on Ctrl-C (finished rows are kept).
    """
    from lmperf.runtime.device import resolve_device

    dev = resolve_device(device)
    plan = plan_sweep(suite, dev.type, impls=as_list(attention), seqs=as_list(context),
                      ds=as_list(d), dtypes=as_list(dtype), batch=batch, heads=heads,
                      causal=causal, warmup=warmup, steps=steps, seed=seed,
                      threads=resolve_threads(threads, dev.type))
    options = sweep_options(inline=inline, timeout=timeout, max_memory_gib=max_memory_gib,
                            resume=resume, progress=progress)
    if plots is not None:
        ensure_folder(Path(plots))  # a bad folder is one line now, not a traceback at the end
    if progress:
        for note in plan.notes:
            err(f"note: {note}")
    report = build_report(run_sweep(plan.specs, Path(out) if out is not None else None, options))
    if plots is not None:
        from lmperf.questions.attention.plots import write_plots

        for path in write_plots(report.records, Path(plots)):
            if progress:
                err(f"plot: {path}")
    return report
