"""`lmperf.dist(...)`: collectives, data-parallel strategies, or an estimate; a Report."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from lmperf.core.command import err, sweep_options
from lmperf.core.report import Report
from lmperf.core.sweep import run_sweep
from lmperf.errors import SpecError
from lmperf.results import store


def dist(what: str = "all", *, world_size: Sequence[int] | int | None = None,
         collective: Sequence[str] | str | None = None,
         sizes: Sequence[str | int] | str | int | None = None, dtype: str = "fp32",
         iters: int = 20, strategy: Sequence[str] | str | None = None, size: str | None = None,
         context: int | None = None, batch: int | None = None, warmup: int | None = None,
         steps: int | None = None, profile_steps: int = 2, vocab_size: int | None = None,
         lr: float = 1e-3, bucket_mb: float = 1.0, compute_dtype: str = "fp32", seed: int = 0,
         device: str = "auto", threads: int | None = None,
         course: str | None = None, plots: str | Path | None = None, out: str | Path | None = None,
         timeout: float | None = None, max_memory_gib: float | None = None,
         resume: bool = False, progress: bool = False, precision: str | None = None,
         checkpoint: str | int = "none", grad_accum: int = 1, attention: str | None = None,
         reference: bool = True, tp: Sequence[int] | int | None = None,
         pp: Sequence[int] | int | None = None, cp: Sequence[int] | int | None = None,
         dp_replicate: Sequence[int] | int | None = None,
         pp_schedule: Sequence[str] | str | None = None,
         pp_virtual: Sequence[int] | int | None = None,
         micro_batch: Sequence[int] | int | None = None, **estimate_options: object) -> Report:
    """Run `what`: 'comm' (collectives), 'train' (strategies), 'all' (both) or 'estimate'.

    comm: every collective x size (bytes or '1KiB'-style) at each world size, `iters` timed
    iterations after `warmup` (default 5). train: every strategy at each world size (strategy
    'single' at world size 1) on the reference LM preset `size` (`vocab_size` overrides its
    vocabulary), `grad_accum` micro-batches of `batch` sequences of `context` tokens per rank
    and step, `precision` 'fp32' (default) or 'bf16-mixed' (bf16 autocast), `checkpoint` the
    activation checkpointing policy (none, full, op, every-K, G blocks per group), `attention`
    (default naive); `reference` False skips the
    check against one process on the global batch. Layouts (docs/commands/dist.md): `tp`,
    `pp` (with `pp_schedule`, `pp_virtual` stages per rank and `micro_batch` sequences per
    pipeline micro-batch), `cp` (refused: CUDA only, not built) and `dp_replicate` (HSDP with
    fsdp2), each one value or a list to sweep; `batch` is then per data-parallel replica, and
    `strategy` the data-parallel part (default fsdp2; none where a layout leaves one replica);
    the world size defaults to the layout's degrees. Each (command, world size) is one torchrun launch; a rank that crashes,
    hangs past `timeout` seconds or runs out of memory is a row naming the rank. None takes the
    device's default (core.vocabulary.DEFAULTS["dist"]). `out`: a JSONL file appended to (None:
    records stay in memory); `plots`: a folder for the PNGs. 'estimate' runs nothing: see
    `lmperf.questions.parallel.estimate.estimate` for its keywords. Raises SpecError for bad input before anything
    runs, SweepInterrupted on Ctrl-C (finished rows are kept in `out`).
    """
    if what == "estimate":
        from lmperf.questions.parallel.estimate import ONLY, estimate

        preset = [f"--{n}" for n, v in (("size", size), ("context", context), ("batch", batch))
                  if v is not None]  # a preset LM's: plan prices it
        if preset:
            raise SpecError(f"{', '.join(preset)}: not taken by --estimate; {ONLY}")
        return estimate(world_size=world_size, **({"tp": tp} if tp is not None else {}),
                        **estimate_options)  # type: ignore[arg-type]
    if estimate_options:
        raise SpecError(f"unknown keyword(s) for dist {what!r}: {', '.join(sorted(estimate_options))}")
    from lmperf.questions.parallel.plan import plan_dist
    from lmperf.questions.parallel.report import build_report

    plan = plan_dist(what, world_size=world_size, collective=collective, sizes=sizes, dtype=dtype,
                     iters=iters, strategy=strategy, size=size, context=context, batch=batch,
                     warmup=warmup, steps=steps, profile_steps=profile_steps, lr=lr,
                     bucket_mb=bucket_mb, compute_dtype=compute_dtype, seed=seed, device=device,
                     threads=threads, timeout=timeout, course=course,
                     vocab_size=vocab_size, max_memory_gib=max_memory_gib, precision=precision,
                     checkpoint=checkpoint, grad_accum=grad_accum, attention=attention,
                     reference=reference, tp=tp, pp=pp, cp=cp, dp_replicate=dp_replicate,
                     pp_schedule=pp_schedule, pp_virtual=pp_virtual, micro_batch=micro_batch)
    if plots is not None:
        store.ensure_folder(Path(plots))  # before anything runs
    out = Path(out) if out is not None else None
    # The runner starts torchrun, which isolates the ranks: no extra child process around it.
    options = sweep_options(inline=True, resume=resume, progress=progress)
    if progress:
        for note in plan.notes:
            err(f"note: {note}")
    records = run_sweep(plan.jobs, out, options)
    report = build_report(records)
    if plots is not None and report.records:
        from lmperf.questions.parallel.plots import plot_records

        for path in plot_records(report.records, plots):
            if progress:
                err(f"plot: {path}")
    return report

