"""The plots of each kind of record, as PNG bytes: the write-up's own figures for bench and
profile (`figures`), and each question's own plot functions for memory, train, attention and
the precision lab, run on the records into a temporary folder.

A plot that cannot be drawn from the records is a Plot with a note saying why, never an
exception: one odd record must not cost the reader the rest of the page.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable

from lmperf.core.report import Report
from lmperf.questions.writeup import figures
from lmperf.questions.writeup.sections import Plot


def _bench(report: Report) -> list[Plot]:
    return [
        Plot("latency vs context length, by size and precision",
             figures.bench_latency(report.frame, report.records), "no ok run to draw"),
        Plot("time per step by phase (stacked)", figures.bench_phases(report.records),
             "no ok run timed a phase"),
    ]


def _profile(report: Report) -> list[Plot]:
    from lmperf.questions.writeup.roofline_figure import roofline_png

    return [Plot("operator categories: share of each phase", figures.profile_shares(report.records),
                 "no ok profile with a category table"),
            Plot("roofline: operators as points sized by their measured time",
                 roofline_png(report.records),
                 "no ok profile with a roofline (records from before it, or failed runs)")]


def _memory(report: Report) -> list[Plot]:
    from lmperf.questions.memory.plots import CONTEXTS_PNG, plot_contexts

    with tempfile.TemporaryDirectory() as tmp:
        path = plot_contexts(report.records, Path(tmp) / CONTEXTS_PNG)
        data = path.read_bytes() if path else None
    return [Plot("memory vs context length (peak of a step; saved for backward)", data,
                 "no ok phases or saved-tensor record to draw")]


def _train(report: Report) -> list[Plot]:
    from lmperf.questions.train.plots import plot_records

    if not any(r["status"] == "ok" and (r.get("metrics") or {}).get("log") for r in report.records):
        return [Plot("training curves", None, "no ok training run with a step log")]
    with tempfile.TemporaryDirectory() as tmp:
        data = plot_records(report.records, Path(tmp) / "train.png").read_bytes()
    return [Plot("training curves: loss, difference to fp32, gradient norm, loss scale, step "
                 "time, throughput, memory", data)]


def _attention(report: Report) -> list[Plot]:
    from lmperf.questions.attention.plots import write_plots

    if not any(r["status"] == "ok" for r in report.records):
        return [Plot("attention latency and memory", None, "no ok attention run to draw")]
    titles = {"latency_vs_seq": "attention latency vs sequence length",
              "memory_vs_seq": "attention memory before backward vs sequence length",
              "speedup_vs_seq": "speedup over naive attention"}
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_plots(report.records, tmp)
        return [Plot(titles.get(p.stem, p.stem), p.read_bytes()) for p in paths]


def _amp(report: Report) -> list[Plot]:
    """Each experiment's own plot, redrawn from its record's tables; experiments without a plot
    and failed ones are named with the reason."""
    from lmperf.questions.amp import get_experiment
    from lmperf.questions.amp.base import ExperimentResult
    from lmperf.results.record import stored_table

    plots = []
    for r in report.records:
        name = str((r.get("spec") or {}).get("experiment", "?"))
        title = f"amp {name}"
        try:
            module = get_experiment(name)
        except ValueError:
            plots.append(Plot(title, None, f"unknown experiment {name!r}"))
            continue
        if not hasattr(module, "plot"):
            plots.append(Plot(title, None, f"the {name} experiment draws no plot (its tables "
                                           "and findings are above)"))
            continue
        metrics = r.get("metrics") or {}
        if r["status"] != "ok" or not metrics.get("tables"):
            plots.append(Plot(title, None, f"not drawn: the run is {r['status']}"))
            continue
        result = ExperimentResult(
            experiment=name, params=dict(metrics.get("params") or r.get("spec") or {}),
            tables=[(t, stored_table(t, rows)) for t, rows in metrics["tables"].items()],
            notes=list(metrics.get("notes") or []))
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{name}.png"
            try:
                module.plot(result, path)
                plots.append(Plot(title, path.read_bytes()))
            except Exception as exc:  # the record lacks what the plot needs: say so, go on
                plots.append(Plot(title, None, f"needs the experiment's own run (lmperf amp "
                                               f"{name} --plots DIR): redrawing it from the "
                                               f"record failed ({type(exc).__name__}: {exc})"))
    return plots


def _dist(report: Report) -> list[Plot]:
    """`lmperf dist`'s own two figures, redrawn from the records."""
    from lmperf.questions.parallel.plots import plot_comm, plot_train

    with tempfile.TemporaryDirectory() as tmp:
        train = plot_train(report.records, Path(tmp) / "train.png")
        comm = plot_comm(report.records, Path(tmp) / "comm.png")
        return [Plot("data-parallel strategies: step time by phase; communication hidden vs "
                     "exposed", train.read_bytes() if train else None, "no ok dist train run"),
                Plot("collectives: bus bandwidth and time vs message size",
                     comm.read_bytes() if comm else None, "no ok dist comm run")]


def _doctor(report: Report) -> list[Plot]:
    return [Plot("doctor: seconds per check by status; low-precision matmul time vs fp32",
                 figures.doctor_checks(report.records), "no doctor record with checks")]


PLOTTERS: dict[str, Callable[[Report], list[Plot]]] = {
    "bench": _bench, "profile": _profile, "memory": _memory, "train": _train,
    "attention": _attention, "amp": _amp, "dist": _dist, "doctor": _doctor,
}


def plots_for(report: Report) -> list[Plot]:
    """The plots of one kind's Report (empty for a kind without plots); a plot that fails to
    draw becomes a Plot with the reason instead of an exception."""
    plotter = PLOTTERS.get(report.kind)
    if plotter is None:
        return []
    try:
        return [p if p.png is not None else Plot(p.title, None, p.note or "nothing to draw")
                for p in plotter(report)]
    except Exception as exc:  # see the module docstring
        return [Plot(f"{report.kind} plots", None, f"could not be drawn from these records "
                                                   f"({type(exc).__name__}: {exc})")]
