"""The sweep: run a list of specs, append each record to a JSONL file as soon as it ends.

Out-of-memory and crashes are rows, not the end of the sweep. With `resume=True`, specs that
already have an 'ok' row in the file are skipped. An interruption (Ctrl-C) kills the running
child and raises `SweepInterrupted`; every finished row is already on disk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol, Sequence

from lmperf.bench.launcher import ChildProcess, run_inline
from lmperf.bench.runner import KIND
from lmperf.bench.spec import RunSpec
from lmperf.results import store


class Reporter(Protocol):
    """Progress callbacks of a sweep (the CLI shows them; the API default ignores them)."""

    def begin(self, total: int, skipped: int) -> None: ...

    def start(self, index: int, spec: RunSpec) -> None: ...

    def finish(self, index: int, spec: RunSpec, record: dict) -> None: ...

    def end(self) -> None: ...


class SilentReporter:
    """A reporter that reports nothing."""

    def begin(self, total: int, skipped: int) -> None:
        pass

    def start(self, index: int, spec: RunSpec) -> None:
        pass

    def finish(self, index: int, spec: RunSpec, record: dict) -> None:
        pass

    def end(self) -> None:
        pass


class SweepInterrupted(Exception):
    """The sweep was interrupted; `records` holds the rows finished (and saved) before that."""

    def __init__(self, records: list[dict], out: Path):
        super().__init__(f"interrupted after {len(records)} finished runs")
        self.records = records
        self.out = out


@dataclass
class SweepOptions:
    """How a sweep runs its specs.

    Attributes:
        isolate: one child process per spec (default); False runs inline, for debugging.
        timeout_s: kill a child that runs longer than this (None: no limit).
        max_memory_gib: cap each child's memory (CPU: address space; CUDA: allocator fraction).
        resume: skip specs that already have an 'ok' row in the output file.
    """

    isolate: bool = True
    timeout_s: float | None = None
    max_memory_gib: float | None = None
    resume: bool = False
    reporter: Reporter = field(default_factory=SilentReporter)


def pending_specs(specs: Sequence, out: Path, resume: bool, kind: str = KIND) -> list:
    """The specs still to run: all of them, or (resume) those without an 'ok' `kind` row in `out`."""
    if not resume or not out.exists():
        return list(specs)
    done = store.finished_keys(store.read_records(out))
    return [s for s in specs if store.spec_key(kind, s.to_dict()) not in done]


def run_sweep(specs: Sequence, out: Path, options: SweepOptions | None = None, *,
              kind: str = KIND, child: type[ChildProcess] = ChildProcess,
              inline: Callable[[object], dict] = run_inline,
              precheck: Callable[[object], dict | None] | None = None) -> list[dict]:
    """Run `specs` and append each record to `out`; return this sweep's records in order.

    The defaults run bench's RunSpecs; other kinds of runs pass their record `kind`, their
    `child` process class, their `inline` runner and optionally a `precheck` that returns a
    record made in the parent (e.g. 'unsupported') instead of starting a child.
    Raises ResultsFileError before running anything if `out` cannot be written or (resume) holds
    a corrupt line, and SweepInterrupted on Ctrl-C.
    """
    options = options or SweepOptions()
    out = Path(out)
    todo = pending_specs(specs, out, options.resume, kind)  # reads (and checks) the file first
    store.ensure_writable(out)
    reporter = options.reporter
    reporter.begin(len(todo), len(specs) - len(todo))
    records: list[dict] = []
    try:
        for i, spec in enumerate(todo):
            reporter.start(i, spec)
            record = precheck(spec) if precheck else None
            if record is None:
                record = (child(spec, options.timeout_s, options.max_memory_gib).run()
                          if options.isolate else inline(spec))
            store.append_record(out, record)
            records.append(record)
            reporter.finish(i, spec, record)
    except KeyboardInterrupt:
        raise SweepInterrupted(records, out) from None
    finally:
        reporter.end()
    return records
