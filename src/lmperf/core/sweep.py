"""The sweep: run a list of jobs, append each record to a JSONL file as soon as its job ends.

Out-of-memory and crashes are rows, not the end of the sweep. With `resume=True`, jobs that
already have an 'ok' row in the file are skipped. An interruption (Ctrl-C) kills the running
child and raises `SweepInterrupted`; every finished row is already on disk. With `out=None`
records stay in memory (the Python API's default).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from lmperf.core.jobs import JobSpec, job_id
from lmperf.core.launch import ChildProcess, WarmChild, run_inline, warm_start_available
from lmperf.results import store
from lmperf.results.record import spec_key


class Reporter:
    """Progress callbacks of a sweep (the CLI shows them: core.progress); this one reports
    nothing (the API's default)."""

    def begin(self, total: int, skipped: int) -> None:
        """`total` jobs to run, `skipped` already ok (--resume)."""

    def start(self, index: int, spec: JobSpec) -> None:
        """Job `index` starts."""

    def finish(self, index: int, spec: JobSpec, records: list[dict]) -> None:
        """Job `index` ended with `records`."""

    def end(self) -> None:
        """The sweep ended (or was interrupted)."""


class SweepInterrupted(Exception):
    """The sweep was interrupted; `records` holds the rows finished (and saved) before that."""

    def __init__(self, records: list[dict], out: Path | None):
        super().__init__(f"interrupted after {len(records)} finished records")
        self.records = records
        self.out = out


@dataclass
class SweepOptions:
    """How a sweep runs its jobs.

    Attributes:
        isolate: one child process per job (default); False runs inline, for debugging.
        warm: fork each child from a warm server that has imported torch (default where the
            platform has one); False starts a fresh interpreter per job.
        timeout_s: kill a child that runs longer than this (None: no limit).
        max_memory_gib: cap each child's memory (CPU: address space; CUDA: allocator fraction).
        resume: skip jobs that already have an 'ok' row in the output file.
        reporter: progress callbacks.
        force: run a job whose pre-flight bound says it cannot fit (estimate.preflight).
        workers: isolated jobs in flight at once (default 1). Above 1, jobs still start in
            order, records are appended as their jobs end and returned in the jobs' order;
            only for jobs that may share the machine (they disturb each other's timings).
    """

    isolate: bool = True
    warm: bool = field(default_factory=warm_start_available)
    timeout_s: float | None = None
    max_memory_gib: float | None = None
    resume: bool = False
    reporter: Reporter = field(default_factory=Reporter)
    workers: int = 1
    force: bool = False


def _normalised_key(spec_type: type, record: dict) -> str:
    """The key of a record's spec after a round trip through its spec class, so that records
    written before a field was added (and filled with its default) still match."""
    try:
        return spec_key(record["kind"], spec_type.from_dict(record["spec"]).to_dict())
    except Exception:  # an older or foreign spec: compare it as written
        return spec_key(record["kind"], record["spec"])


def round_id(spec: JobSpec, round_: int, rounds: int) -> str:
    """The job id of one round of a spec (the spec's own id when there is one round)."""
    jid = job_id(spec)
    return jid if rounds == 1 else f"{jid}-r{round_}"


def pending_specs(specs: Sequence[JobSpec], out: Path | None, resume: bool) -> list[JobSpec]:
    """The jobs still to run: all of them, or (resume) those without an 'ok' row in `out`."""
    return [s for s, _ in _pending([(s, 0) for s in specs], out, resume, 1)]


def _pending(jobs: list[tuple[JobSpec, int]], out: Path | None, resume: bool,
             rounds: int) -> list[tuple[JobSpec, int]]:
    if not resume or out is None or not Path(out).exists() or not jobs:
        return list(jobs)
    ok = [r for r in store.read_records(Path(out)) if r["status"] == "ok"]
    done_ids = {r.get("job_id") for r in ok}
    done_keys: set[str] = set()
    if rounds == 1:  # records of single-round jobs written before job ids: match the spec
        types = {type(s) for s, _ in jobs}
        done_keys = {_normalised_key(t, r) for t in types for r in ok if "round" not in r}
    # A job of several items is decided item by item (`_items_left`): its id on one ok record
    # says only that one of its items ended well.
    left = [(s, k) for s, k in jobs if (rounds == 1 and _has_items(s))
            or (round_id(s, k, rounds) not in done_ids
                and spec_key(s.kind, s.to_dict()) not in done_keys)]
    return [(s, k) for s, k in ((_items_left(s, ok), k) for s, k in left) if s is not None]


def _has_items(spec: JobSpec) -> bool:
    """Whether a job has several items, one record each (`items()`, `item_spec(item)`,
    `with_items(items)`)."""
    return all(hasattr(spec, a) for a in ("items", "item_spec", "with_items"))


def _items_left(spec: JobSpec, ok: list[dict]) -> JobSpec | None:
    """A job of several items (one record each: `items()`, `item_spec(item)`,
    `with_items(items)`, e.g. lmperf dist's) narrowed to the items without an 'ok' record;
    None when every item has one. Other jobs are returned as they are."""
    if not _has_items(spec):
        return spec
    done = {spec_key(r["kind"], r["spec"]) for r in ok if r["kind"] == spec.kind}
    items = spec.items()  # type: ignore[attr-defined]
    todo = [i for i in items if spec_key(spec.kind, spec.item_spec(i)) not in done]  # type: ignore[attr-defined]
    if not todo:
        return None
    return spec if len(todo) == len(items) else spec.with_items(todo)  # type: ignore[attr-defined]


def run_sweep(specs: Sequence[JobSpec], out: Path | None, options: SweepOptions | None = None, *,
              precheck: Callable[[JobSpec], dict | None] | None = None,
              rounds: int = 1) -> list[dict]:
    """Run `specs` and append each record to `out` (None: keep them in memory only).

    `rounds` > 1 runs the whole list that many times, round-robin (spec 1, 2, ..., n, then
    again), so that slow drift and a neighbour's burst of load hit every spec alike; each
    record then carries its `round` (0-based) and a job id per round (see `round_id`). Every
    record carries its `sweep`: when the sweep started (a --resume continues the sweep it
    finishes), so that two runs of one spec are told apart and never held against each other.
    `precheck` may return a record made in the parent (e.g. 'unsupported') instead of running
    the job. Returns this sweep's records in order; with `options.resume` (one round) the
    whole sweep's, the 'ok' records of the jobs done before (read from `out`) in their place. Raises ResultsFileError before running
    anything if `out` cannot be written or (resume) holds a corrupt line, SpecError for a CPU
    memory cap no job can start under (core.capfloor), and SweepInterrupted on Ctrl-C.
    """
    options = options or SweepOptions()
    out = Path(out) if out is not None else None
    if options.isolate and options.max_memory_gib and any(
            getattr(s, "device", None) == "cpu" for s in specs):
        from lmperf.core.capfloor import check_cap

        check_cap(options.max_memory_gib, options.warm)  # a cap no job can start under
    jobs = [(spec, k) for k in range(rounds) for spec in specs]
    todo = _pending(jobs, out, options.resume, rounds)  # reads (and checks) the file first
    if out is not None:
        store.ensure_writable(out)
    sweep = _sweep_id(jobs, out, rounds) if len(todo) < len(jobs) else _now()
    reporter = options.reporter
    reporter.begin(len(todo), len(jobs) - len(todo))
    finished: dict[int, list[dict]] = {}

    def done(i: int, new: list[dict]) -> None:
        spec, k = todo[i]
        tag = ({"job_id": round_id(spec, k, rounds), "sweep": sweep}
               | ({"round": k} if rounds > 1 else {}))
        new = [{**record, **tag} for record in new]
        for record in new:
            if out is not None:
                store.append_record(out, record)
        finished[i] = new
        reporter.finish(i, spec, new)

    try:
        if options.isolate and options.workers > 1:
            _in_parallel([s for s, _ in todo], options, precheck, done)
        else:
            for i, (spec, _) in enumerate(todo):
                reporter.start(i, spec)
                done(i, _run_one(spec, options, precheck))
    except KeyboardInterrupt:
        raise SweepInterrupted([r for i in sorted(finished) for r in finished[i]], out) from None
    finally:
        reporter.end()
    ran = [r for i in sorted(finished) for r in finished[i]]
    if not options.resume or out is None or rounds > 1 or len(todo) == len(jobs):
        return ran
    return _whole_sweep(specs, ran, store.read_records(out))


def _now() -> str:
    """A sweep's id: when it started (UTC, to the second), which tells runs of one spec apart."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _sweep_id(jobs: list[tuple[JobSpec, int]], out: Path | None, rounds: int) -> str:
    """The id of the sweep a --resume finishes: that of its jobs' latest earlier record."""
    ids = {round_id(s, k, rounds) for s, k in jobs}
    earlier = [r["sweep"] for r in (store.read_records(out) if out is not None else [])
               if r.get("job_id") in ids and r.get("sweep")]
    return earlier[-1] if earlier else _now()


def _whole_sweep(specs: Sequence[JobSpec], ran: list[dict], earlier: list[dict]) -> list[dict]:
    """The records of every job of a resumed sweep, in job order: the records it ran now, and
    for a job done before, its latest 'ok' record per spec (a job of several items: those
    done before beside those run now)."""
    now = {r["job_id"] for r in ran}
    done: dict[str | None, dict[str, dict]] = {}
    for r in earlier:
        if r["status"] == "ok" and r.get("job_id") not in now:
            done.setdefault(r.get("job_id"), {})[spec_key(r["kind"], r["spec"])] = r
    keys = {_normalised_key(type(s), r): r for s in specs[:1] for d in done.values()
            for r in d.values()}  # records written before job ids: matched by spec
    whole: list[dict] = []
    for spec in specs:
        jid = job_id(spec)
        before = list(done.get(jid, {}).values())
        if not before and (r := keys.get(spec_key(spec.kind, spec.to_dict()))) is not None:
            before = [r]
        whole += before + [r for r in ran if r["job_id"] == jid]
    placed = {id(r) for r in whole}
    return whole + [r for r in ran if id(r) not in placed]  # a job narrowed to its items left


def _run_one(spec: JobSpec, options: SweepOptions,
             precheck: Callable[[JobSpec], dict | None] | None,
             running: list[ChildProcess] | None = None) -> list[dict]:
    """One job's records: the precheck's, or the job's run in a child process (listed in
    `running` while it runs, so that another thread can kill it) or inline."""
    first = precheck(spec) if precheck else None
    if first is not None:
        return [first]
    if not options.isolate:
        return run_inline(spec, options.force)
    launcher = (WarmChild if options.warm else ChildProcess)(spec, options.timeout_s,
                                                              options.max_memory_gib,
                                                              options.force)
    if running is None:  # this thread gets Ctrl-C itself: the launcher kills its child
        return launcher.run()
    running.append(launcher)
    try:
        return launcher.run()
    finally:
        running.remove(launcher)


def _in_parallel(specs: list[JobSpec], options: SweepOptions,
                 precheck: Callable[[JobSpec], dict | None] | None,
                 done: Callable[[int, list[dict]], None]) -> None:
    """Run `specs` in child processes, `options.workers` at a time, started in order; `done(i,
    records)` is called in this thread as each ends. Ctrl-C reaches this thread only: it kills
    the running children (their threads then return) and drops the jobs not started."""
    running: list[ChildProcess] = []

    def run(i: int, spec: JobSpec) -> list[dict]:
        options.reporter.start(i, spec)  # from a worker thread (rich's Progress has a lock)
        return _run_one(spec, options, precheck, running)

    pool = ThreadPoolExecutor(max_workers=options.workers, thread_name_prefix="lmperf-sweep")
    futures = {pool.submit(run, i, spec): i for i, spec in enumerate(specs)}
    try:
        for future in as_completed(futures):
            done(futures[future], future.result())
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        for launcher in list(running):
            launcher.kill()
        raise
    pool.shutdown()
