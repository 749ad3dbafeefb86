"""Terminal progress of a sweep: a bar on stderr, one line per finished record, and the noise
warnings of the whole sweep as one line at its end (each record keeps its own)."""

from __future__ import annotations

import re

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from lmperf.catalog import BY_KIND
from lmperf.core.jobs import resolve
from lmperf.core.sweep import Reporter

_STYLE = {"ok": "green", "oom": "yellow", "error": "red", "unsupported": "magenta"}
WIDTH = 120  # a progress line is cut to this many columns (the record keeps it whole)
NOISE = re.compile(r"^IQR/median ([^:]*):")  # measure.stats.spread_warning's noise warnings

# kind -> "module:function" giving one line for a finished record of that kind
SUMMARIES: dict[str, str] = {kind: q.summary for kind, q in BY_KIND.items() if q.summary}


def _fit(text: str, used: int) -> str:
    """`text` with numbers written plainly (no scientific notation), cut with '…' to fit the
    WIDTH - `used` columns left on its line."""
    from lmperf.core.report import plain_numbers  # pandas: loaded once jobs are running

    text = " ".join(plain_numbers(text).split())
    room = max(WIDTH - used, 20)
    return text if len(text) <= room else text[:room - 1] + "…"


def summary_line(record: dict) -> str:
    """One line for a finished record: its question's summary, or its status and message."""
    if record["kind"] in SUMMARIES:
        try:
            return resolve(SUMMARIES[record["kind"]])(record)
        except (ImportError, AttributeError):
            pass
    if record["status"] != "ok":
        return f"{record['status']}: {record.get('message', '')}"
    return "ok"


class RichReporter(Reporter):
    """Shows a progress bar on stderr and prints a line as each record arrives."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console(stderr=True, soft_wrap=True)
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), console=self.console,
                                 transient=True)
        self.task = None
        self.runs, self.kind, self.noise = 0, "", []  # each noisy run's largest IQR/median, %
        self.repeats: dict[tuple[str, str], int] = {}  # (status, reason) -> rows not printed

    def begin(self, total: int, skipped: int) -> None:
        if skipped:
            self.console.print(f"resume: {skipped} job(s) already ok in the results file, "
                               f"{total} to go", highlight=False)
        self.progress.start()
        self.task = self.progress.add_task("starting", total=total)

    def start(self, index: int, spec) -> None:
        self.progress.update(self.task, description=spec.label())

    def finish(self, index: int, spec, records: list[dict]) -> None:
        for record in records:
            self.runs, self.kind = self.runs + 1, record["kind"]
            reason = (record["status"], str(record.get("message", "")))
            if record["status"] != "ok" and reason[1] and reason in self.repeats:
                self.repeats[reason] += 1  # said once (the doctor's 22 CUDA checks on a CPU)
                continue
            if record["status"] != "ok" and reason[1]:
                self.repeats[reason] = 0
            style = _STYLE.get(record["status"], "white")
            # escape(): messages hold brackets ("[enforce fail at alloc_cpu.cpp:127]")
            label = spec.label()
            line = _fit(summary_line(record), 14 + len(label))  # "{status:>11} {label}: "
            self.progress.console.print(f"[{style}]{record['status']:>11}[/] "
                                        f"{escape(label)}: {escape(line)}",
                                        markup=True, highlight=False, soft_wrap=True)
            for w in record.get("warnings", []):
                if (noisy := NOISE.match(w)):  # told once, at the end (the record keeps it)
                    self.noise.append(max(float(x) for x in re.findall(r"(\d+)%", noisy[1])))
                    continue
                self.progress.console.print(f"{'':>11}   [dim]warning: {escape(_fit(w, 23))}[/]",
                                            highlight=False, soft_wrap=True)
        self.progress.advance(self.task)

    def end(self) -> None:
        """Stop the bar; the sweep's noisy runs in one line: "7 of 15 runs noisy, IQR/median up
        to 339%: the machine was busy; `--rounds 3` interleaves them"."""
        self.progress.stop()
        for (status, reason), n in self.repeats.items():
            if n:
                self.console.print(escape(f"{status:>11} {n} more for the same reason: "
                                          f"{_fit(reason, 42)}"), highlight=False)
        if self.noise:  # busy: above torch.utils.benchmark's 25%
            from lmperf.core.report import wrap

            busy = "busy" if max(self.noise) > 25 else "noisy"
            self.console.print(escape(wrap(
                f"warning: {len(self.noise)} of {self.runs} runs noisy, IQR/median up to "
                f"{max(self.noise):.0f}%: the machine was {busy}; " + (
                    "`--rounds 3` interleaves them" if self.kind == "bench"
                    else "a quiet machine and more --steps steady them"), "", "  ")),
                highlight=False)
