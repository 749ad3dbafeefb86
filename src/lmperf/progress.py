"""Terminal output for sweeps: a progress bar with one line per finished run, and rich tables."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from lmperf.results.tables import render

if TYPE_CHECKING:
    from lmperf.bench.spec import RunSpec

_STYLE = {"ok": "green", "oom": "yellow", "error": "red", "unsupported": "magenta"}


def summary_line(record: dict) -> str:
    """One line for a finished run: step time, throughput, or why it did not run."""
    status = record["status"]
    if status != "ok":
        return f"{status}: {record.get('message', '')}"
    m = record["metrics"]
    step = m["step_ms"]
    return (f"step {step['median']:.2f} ms median ({step['mean']:.2f} ± {step['std']:.2f} mean ± std, "
            f"n={step['n']}), {m['tokens_per_s']:,.0f} tokens/s")


class RichReporter:
    """Shows a progress bar on stderr and prints a line as each run finishes."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console(stderr=True, soft_wrap=True)
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), console=self.console,
                                 transient=True)
        self.task = None

    def begin(self, total: int, skipped: int) -> None:
        if skipped:
            self.console.print(f"resume: {skipped} run(s) already ok in the results file, {total} to go")
        self.progress.start()
        self.task = self.progress.add_task("starting", total=total)

    def start(self, index: int, spec: RunSpec) -> None:
        self.progress.update(self.task, description=spec.label())

    def finish(self, index: int, spec: RunSpec, record: dict) -> None:
        style = _STYLE.get(record["status"], "white")
        self.progress.console.print(f"[{style}]{record['status']:>11}[/] {spec.label()}: "
                                    f"{summary_line(record)}", markup=True, highlight=False,
                                    soft_wrap=True)
        for w in record.get("warnings", []):
            self.progress.console.print(f"{'':>11}   [dim]warning: {w}[/]", highlight=False,
                                        soft_wrap=True)
        self.progress.advance(self.task)

    def end(self) -> None:
        self.progress.stop()


def print_table(records: list[dict], title: str | None = None) -> None:
    """Print the text table of `records` to stdout (plain text: it never wraps columns)."""
    if title:
        print(title)
    print(render(records, "text"), end="")
