"""`lmperf.memory(...)`: where the memory of training goes; a Report.

Measurements that allocate (peaks per phase, saved tensors, checkpointing) are jobs of the core
launcher, each in its own child process unless `inline`; the analytic estimate and a snapshot
summary allocate nothing and run here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from lmperf.core.command import err, sweep_options
from lmperf.core.report import Report
from lmperf.core.sweep import run_sweep
from lmperf.model.presets import DEFAULT_COURSE
from lmperf.questions.memory.plan import DEFAULT_MODES, estimate_records, plan_memory
from lmperf.questions.memory.report import build_report
from lmperf.units import GIB


def memory(size: str | None = None, *, model: str | None = None,
           context: Sequence[int] | int | None = None, batch: int = 4,
           precision: Sequence[str] | str | None = None,
           mode: Sequence[str] | str = DEFAULT_MODES, attention: str | None = None,
           optimizer: str = "auto", warmup: int = 1, steps: int = 3, seed: int = 0,
           device: str = "auto", threads: int | None = None, model_context: int = 0,
           estimate: bool = False, gib: float | None = None, gpu: str | None = None,
           checkpoint: Sequence[str | int] | str | int | None = None, float8: str = "none",
           snapshot: str | Path | None = None,
           top: int = 10, course: str = DEFAULT_COURSE, plots: str | Path | None = None,
           out: str | Path | None = None,
           inline: bool = False, timeout: float | None = None,
           max_memory_gib: float | None = None, resume: bool = False,
           progress: bool = False, force: bool = False,
           vocab_size: int | None = None) -> Report:
    """Measure where the memory of the reference LM (or `model`) goes, over `context` x
    `precision`; keywords and defaults are `lmperf memory`'s flags (docs/commands/memory.md;
    None: the device's default, core.vocabulary.DEFAULTS["memory"]), except `out`: None keeps
    the records in memory (the CLI writes results/memory.jsonl).

    What runs: peaks per phase and saved tensors (default); one simulated step per row,
    nothing allocated (`estimate`, `gib` or `gpu`); the checkpointing trade-off (`checkpoint`);
    or a CUDA snapshot's summary (`snapshot`; no records). Failed measurements (oom, error,
    unsupported) are rows of the Report; `force` runs a job that the pre-flight predicts cannot
    fit (else an 'oom' row in seconds). Raises SpecError / ModelLoadError before anything runs
    for bad input, SweepInterrupted on Ctrl-C.
    """
    if snapshot is not None:
        return snapshot_report(snapshot, plots)

    if gpu is not None:  # "will it fit on NAME": its memory is the budget, CUDA the device
        from lmperf.errors import SpecError
        from lmperf.runtime.peaks import require_device

        card = require_device(gpu)
        if device not in ("auto", "cuda"):
            raise SpecError(f"--gpu {gpu} estimates for CUDA; --device {device} contradicts it")
        # one rule with plan and dist (estimate.target.cluster): --gib replaces its memory
        gib, device, estimate = gib if gib is not None else card.memory_gib, "cuda", True
    attention = attention or ("sdpa" if gpu is not None else "naive")
    plan = plan_memory(size=size, model=model, context=context, batch=batch,
                       precision=precision, mode=mode, attention=attention, optimizer=optimizer,
                       warmup=warmup, steps=steps, seed=seed, device=device, threads=threads,
                       model_context=model_context, estimate=estimate, gib=gib,
                       checkpoint=checkpoint, float8=float8, top=top, course=course,
                       vocab_size=vocab_size)
    options = sweep_options(inline=inline, timeout=timeout, max_memory_gib=max_memory_gib,
                            resume=resume, progress=progress)
    options.force = force
    if plots is not None:  # a bad folder is one line now, not a traceback at the end
        from lmperf.results.store import ensure_folder

        ensure_folder(Path(plots))
    results: dict = {}  # the estimate's simulated steps, for its timeline plots
    if not plan.jobs:  # the estimate: simulated here, nothing allocated, nothing to launch
        import torch

        from lmperf.estimate.preflight import available
        from lmperf.runtime.device import cuda_available

        room = None  # the default budget: what this machine has left (not a GPU it lacks)
        if gib is None and (plan.base.device == "cpu" or cuda_available()):
            room = available(torch.device(plan.base.device))
        records = estimate_records(plan, room[0] / GIB if room else gib, results)
        for record in records if gpu is not None or room else ():  # what the budget is
            record["metrics"].update({"gpu": card.name} if gpu is not None else
                                     {"budget": f"{room[1].split(' (')[0]} on this "
                                                f"{plan.base.device.upper()}"})
        if out is not None:  # records made here, not by a sweep
            from lmperf.results.store import append_record, ensure_writable

            ensure_writable(Path(out))
            for record in records:
                append_record(Path(out), record)
    else:
        records = run_sweep(plan.jobs, out, options)
    report = build_report(records)
    if plots is not None:
        from lmperf.questions.memory.plots import CONTEXTS_PNG, plot_contexts, plot_timelines

        paths = (plot_timelines(results, plots) if not plan.jobs else
                 [plot_contexts(report.records, Path(plots) / CONTEXTS_PNG)])
        for path in filter(None, paths):
            report.findings.append(f"plot: {path}")
            if progress:
                err(f"plot: {path}")
    return report


def snapshot_report(path: str | Path, plots: str | Path | None = None) -> Report:
    """The summary of a CUDA memory snapshot pickle as a Report (no records: nothing ran);
    with `plots`, active memory over the recorded events drawn there."""
    from lmperf.questions.memory import snapshot_read as snapshot

    path = Path(path)
    png = Path(plots) / f"{path.stem}_active_memory.png" if plots is not None else None
    summary = snapshot.summarize_snapshot(path, png)
    tables = dict(summary.tables)
    title, frame = next(iter(tables.items()))
    del tables[title]
    findings = list(summary.notes) + ([f"plot: {summary.png}"] if summary.png else [])
    return Report(kind="memory", frame=frame, tables=tables, findings=findings, records=[],
                  title=title)
