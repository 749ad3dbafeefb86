"""`lmperf.profile(...)`: one run under torch.profiler, or an existing trace, tables per phase;
a Report."""

from __future__ import annotations

from pathlib import Path

from lmperf.model.presets import DEFAULT_COURSE
from lmperf.core.command import err, sweep_options
from lmperf.core.report import Report
from lmperf.errors import SpecError


def profile(size: str | None = None, *, model: str | None = None, context: int | None = None,
            batch: int = 4, precision: str | None = None, mode: str = "train-step",
            attention: str = "naive", warmup: int = 2, steps: int = 10, seed: int = 0,
            optimizer: str = "auto", device: str = "auto", threads: int | None = None,
            model_context: int = 0, top: int = 10,
            trace: str | Path | None = None, out: str | Path | None = None,
            inline: bool = False, timeout: float | None = None,
            max_memory_gib: float | None = None, resume: bool = False,
            progress: bool = False, from_trace: str | Path | None = None,
            course: str = DEFAULT_COURSE, compile: bool = False,
            compile_mode: str = "default") -> Report:
    """Profile one run of the reference LM (or `model`, "package.module:factory"): `warmup`
    untimed steps, `steps` timed steps without the profiler, then `steps` profiled steps; the
    trace is parsed once into per-phase tables (top operators or kernels, categories, matmul
    share, attention runtime vs FLOPs) and findings. Runs in a child process unless `inline`.

    Keywords and defaults are `lmperf profile`'s flags (None: the device's default, see
    core.vocabulary.DEFAULTS["profile"]; threads None: 1 on the CPU), except `out`: None keeps
    the record in memory (the CLI appends to results/profile.jsonl). `trace` None writes
    traces/<run>.json beside `out` (results/traces/<run>.json when `out` is None). An
    out-of-memory run is an 'oom' row of the Report, a crash or timeout an 'error' row. Raises SpecError / ModelLoadError before anything runs for bad input,
    SweepInterrupted on Ctrl-C.

    `from_trace` (a torch.profiler Chrome trace, .json or .json.gz, from any program) analyses
    that file instead of running anything: the same tables, steps from its ProfilerStep#N,
    phases from its annotations (`profile.from_trace`); only `top` applies, no record is
    written. Raises TraceFormatError for a missing or corrupt file or a directory (many ranks'
    traces: HTA), SpecError when a run option is given with it.
    """
    if from_trace is not None:
        given = {name: value for name, value in dict(
            size=size, model=model, context=context, precision=precision, threads=threads,
            trace=trace, out=out, timeout=timeout, max_memory_gib=max_memory_gib).items()
            if value is not None}
        given |= {name: True for name, on in (("inline", inline), ("resume", resume)) if on}
        if given:
            raise SpecError("from_trace analyses existing traces; it takes no run options "
                            f"(got {', '.join(sorted(given))})")
        from lmperf.questions.profile.from_trace import analyse_trace

        return analyse_trace(from_trace, top=top)
    # Imported here: planning a run imports torch (seconds, ~250 MB), which analysing an
    # existing trace does not need.
    from lmperf.core.sweep import run_sweep
    from lmperf.questions.profile.plan import plan_profile
    from lmperf.questions.profile.report import build_report

    plan = plan_profile(size=size, model=model, context=context, batch=batch,
                        precision=precision, mode=mode, attention=attention, warmup=warmup,
                        steps=steps, seed=seed, optimizer=optimizer, device=device,
                        threads=threads, model_context=model_context, top=top,
                        trace=trace, out=out, course=course, compile=compile,
                        compile_mode=compile_mode)
    options = sweep_options(inline=inline, timeout=timeout, max_memory_gib=max_memory_gib,
                            resume=resume, progress=progress)
    spec = plan.spec
    if progress:
        for note in plan.notes:
            err(f"note: {note}")
        for warning in plan.warnings:
            err(f"warning: {warning}")
        err(f"profiling {spec.label()}: {spec.warmup} warm-up, {spec.steps} unprofiled and "
            f"{spec.steps} profiled steps ...")
    return build_report(run_sweep([spec], out, options))
