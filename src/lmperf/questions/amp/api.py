"""`lmperf.amp(experiment, ...)`: run one precision experiment (or "all"); a Report."""

from __future__ import annotations

from pathlib import Path

from lmperf.core.report import Report


def amp(experiment: str, *, device: str = "auto", out: str | Path | None = None,
        plots: str | Path | None = None, **options: object) -> Report:
    """Run precision experiment `experiment` (see `lmperf amp`; "all" runs every one) on this
    device and torch, and return its Report: for one experiment `frame` is its first table and
    `tables` the others, `findings` its findings; for "all", one summary row per experiment.

    `options` are the experiment's own (named as its CLI flags: `n`, `addend`, ...; unknown
    ones raise SpecError); `plots` is a folder for its PNG; `out` appends the records to a
    JSONL file (None: in memory only). A failure inside an experiment is an 'error' row.
    """
    from lmperf.questions.amp import EXPERIMENT_NAMES, get_experiment
    from lmperf.questions.amp.report import build_report
    from lmperf.questions.amp.runner import check_options, run_experiment
    from lmperf.results.store import append_record, ensure_writable
    from lmperf.runtime.device import resolve_device

    names = list(EXPERIMENT_NAMES) if experiment == "all" else [experiment]
    try:
        modules = [get_experiment(n) for n in names]
    except ValueError as exc:
        from lmperf.errors import SpecError

        raise SpecError(str(exc)) from None
    if experiment != "all":
        check_options(modules[0], options)
    dev = resolve_device(device)
    if out is not None:
        ensure_writable(Path(out))
    records = []
    for name, module in zip(names, modules):
        png = Path(plots) / f"{name}.png" if plots is not None and hasattr(module, "plot") else None
        outcome = run_experiment(name, dev, options if experiment != "all" else {}, png)
        if out is not None:
            append_record(Path(out), outcome.record)
        records.append(outcome.record)
    return build_report(records)
