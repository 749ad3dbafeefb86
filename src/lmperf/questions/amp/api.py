"""`lmperf.amp(experiment, ...)`: run one precision experiment (or "all"); a Report."""

from __future__ import annotations

from pathlib import Path

from lmperf.core.report import Report


def plan_amp(experiment: str, device: str = "auto", plots: str | Path | None = None,
             threads: int | None = None, **options: object) -> list:
    """The AmpSpec jobs of `lmperf amp EXPERIMENT` ("all": every experiment with its defaults),
    options checked here, before anything runs (SpecError for a bad name or value)."""
    from lmperf.core.vocabulary import resolve_threads
    from lmperf.errors import SpecError
    from lmperf.questions.amp import EXPERIMENT_NAMES, get_experiment
    from lmperf.questions.amp.job import check_options
    from lmperf.questions.amp.spec import AmpSpec
    from lmperf.runtime.device import resolve_device

    names = list(EXPERIMENT_NAMES) if experiment == "all" else [experiment]
    modules = [get_experiment(n) for n in names]
    dev = resolve_device(device)
    if experiment == "all" and options:
        raise SpecError("lmperf amp all runs every experiment with its defaults; options go to "
                        "one experiment (lmperf amp NAME --help)")
    if experiment != "all":
        check_options(modules[0], options, dev)
    n_threads = resolve_threads(threads, dev.type)
    return [AmpSpec(experiment=name, device=dev.type, options=tuple(options.items()),
                    plot=str(Path(plots) / f"{name}.png") if plots is not None
                    and hasattr(module, "plot") else None, threads=n_threads)
            for name, module in zip(names, modules)]


def amp(experiment: str, *, device: str = "auto", out: str | Path | None = None,
        plots: str | Path | None = None, threads: int | None = None, inline: bool = False,
        timeout: float | None = None, max_memory_gib: float | None = None,
        resume: bool = False, progress: bool = False, **options: object) -> Report:
    """Run precision experiment `experiment` ("all": every one) as `lmperf amp` does, and return
    its Report (`report.build_report`). `options` are the experiment's own, named as its CLI
    flags (`n`, `addend`, ...; SpecError for an unknown name or a bad value, before anything
    runs); `plots` is a folder for its PNG; the launch options are every command's.
    """
    from lmperf.core.command import sweep_options
    from lmperf.core.sweep import run_sweep
    from lmperf.questions.amp.report import build_report

    specs = plan_amp(experiment, device=device, plots=plots, threads=threads, **options)
    sweep = sweep_options(inline=inline, timeout=timeout, max_memory_gib=max_memory_gib,
                          resume=resume, progress=progress)
    return build_report(run_sweep(specs, out, sweep))
