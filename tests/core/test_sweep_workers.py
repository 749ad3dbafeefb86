"""The sweep with several jobs in flight (`SweepOptions.workers`, the doctor's CPU checks) and
the resume of a job of several items: launchers are stand-ins here (no process), so the order
of events is the test's to decide."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from typing import ClassVar

import pytest

from lmperf.core import sweep
from lmperf.core.sweep import SweepInterrupted, SweepOptions, run_sweep
from lmperf.results.schema import make_record
from lmperf.results.store import read_records


@dataclass(frozen=True)
class Job:
    kind: ClassVar[str] = "doctor"
    runner: ClassVar[str] = "tests.core.test_sweep_workers:run_items"

    name: str
    device: str = "cpu"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Job":
        return cls(**data)

    def label(self) -> str:
        return self.name


def _record(spec: dict, status: str = "ok") -> dict:
    return make_record("doctor", spec, status, {}, metrics={})


class FakeChild:
    """Stands in for WarmChild: `run` waits until the test releases the job (its Event)."""

    release: dict[str, threading.Event] = {}
    started: list[str] = []
    killed: list[str] = []
    in_flight = 0
    most_in_flight = 0
    lock = threading.Lock()

    def __init__(self, spec, timeout_s=None, max_memory_gib=None, force=False):
        self.spec = spec

    def run(self) -> list[dict]:
        cls = FakeChild
        with cls.lock:
            cls.started.append(self.spec.name)
            cls.in_flight += 1
            cls.most_in_flight = max(cls.most_in_flight, cls.in_flight)
        cls.release[self.spec.name].wait(timeout=10)
        with cls.lock:
            cls.in_flight -= 1
        return [_record(self.spec.to_dict())]

    def kill(self) -> None:
        FakeChild.killed.append(self.spec.name)
        FakeChild.release[self.spec.name].set()


@pytest.fixture
def fake(monkeypatch):
    FakeChild.release = {n: threading.Event() for n in "abc"}
    FakeChild.started, FakeChild.killed = [], []
    FakeChild.in_flight = FakeChild.most_in_flight = 0
    monkeypatch.setattr(sweep, "WarmChild", FakeChild)
    return FakeChild


class Releasing:
    """A reporter that lets job `b` end first, then `a`, then `c`; `stop_after` raises
    KeyboardInterrupt (Ctrl-C) once that many jobs have ended."""

    def __init__(self, fake, stop_after: int | None = None):
        self.fake, self.stop_after, self.ended = fake, stop_after, []

    def begin(self, total, skipped):
        pass

    def start(self, index, spec):
        if spec.name == "b":
            self.fake.release["b"].set()

    def finish(self, index, spec, records):
        self.ended.append(spec.name)
        if self.stop_after is not None and len(self.ended) >= self.stop_after:
            raise KeyboardInterrupt
        self.fake.release["a" if spec.name == "b" else "c"].set()

    def end(self):
        pass


def test_two_workers_append_as_jobs_end_and_return_in_the_jobs_order(tmp_path, fake):
    out = tmp_path / "r.jsonl"
    reporter = Releasing(fake)
    records = run_sweep([Job("a"), Job("b"), Job("c")], out,
                        SweepOptions(warm=True, workers=2, reporter=reporter))
    assert [r["spec"]["name"] for r in records] == ["a", "b", "c"]
    assert [r["spec"]["name"] for r in read_records(out)] == ["b", "a", "c"]  # as they ended
    assert fake.started[:2] == ["a", "b"] and fake.most_in_flight == 2


def test_ctrl_c_kills_the_running_children_and_keeps_the_finished_rows(tmp_path, fake):
    out = tmp_path / "r.jsonl"
    with pytest.raises(SweepInterrupted) as stop:
        run_sweep([Job("a"), Job("b"), Job("c")], out,
                  SweepOptions(warm=True, workers=2, reporter=Releasing(fake, stop_after=1)))
    assert [r["spec"]["name"] for r in stop.value.records] == ["b"]
    # every job running then was killed ('c' may have started in b's thread meanwhile)
    assert "a" in fake.killed and sorted(fake.killed) == sorted(set(fake.started) - {"b"})
    assert [r["spec"]["name"] for r in read_records(out)] == ["b"]


# --- resume of a job of several items ------------------------------------------------------------

RAN: list[list[str]] = []


@dataclass(frozen=True)
class Items:
    kind: ClassVar[str] = "doctor"
    runner: ClassVar[str] = "tests.core.test_sweep_workers:run_items"

    items_: tuple[str, ...]
    device: str = "cpu"

    def to_dict(self) -> dict:
        return {"items_": list(self.items_), "device": self.device}

    def items(self) -> list[str]:
        return list(self.items_)

    def item_spec(self, item: str) -> dict:
        return {"item": item}

    def with_items(self, items: list[str]) -> "Items":
        return Items(tuple(items))

    def label(self) -> str:
        return "items"


def run_items(job: Items) -> list[dict]:
    """One record per item: 'ok', except items named 'bad' (an error)."""
    RAN.append(job.items())
    return [_record(job.item_spec(i), "error" if i == "bad" else "ok") for i in job.items()]


def test_resume_reruns_the_items_not_ok_of_a_job_with_an_ok_item(tmp_path):
    out = tmp_path / "r.jsonl"
    RAN.clear()
    run_sweep([Items(("good", "bad"))], out, SweepOptions(isolate=False))
    run_sweep([Items(("good", "bad"))], out, SweepOptions(isolate=False, resume=True))
    # the job's id is on good's ok record, yet 'bad' must run again
    assert RAN == [["good", "bad"], ["bad"]]
