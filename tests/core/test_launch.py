"""Jobs on the launcher: a runner's records come back tagged with the job id, inline or in a
child; a job whose child dies is one error row made by the parent."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import pytest
from typing import ClassVar

from lmperf.core.jobs import class_path, job_id, resolve
from lmperf.core.launch import ChildProcess, WarmChild, describe_exit, run_inline
from lmperf.core.outcome import Stage, failure, first_line
from lmperf.results.schema import make_record


@dataclass(frozen=True)
class EchoSpec:
    """A job whose runner returns one record per `count` (or dies, with `die`)."""

    kind: ClassVar[str] = "echo"
    runner: ClassVar[str] = "tests.core.test_launch:run_echo"
    count: int = 2
    die: bool = False
    threads: int = 1
    device: str = "cpu"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "EchoSpec":
        return cls(**data)

    def label(self) -> str:
        return f"echo x{self.count}"


def run_echo(spec: EchoSpec) -> list[dict]:
    import os
    import time

    import torch

    if spec.die:  # a crash after one step
        from lmperf.core.heartbeat import beat

        beat(stage="timed steps", steps_done=1, steps=5, samples_ms=[2.5])
        os.abort()
    if spec.count < 0:  # a job that never ends, after finishing two of its steps
        from lmperf.core.heartbeat import beat

        beat(stage="timed steps", steps_done=2, steps=5, samples_ms=[1.5, 1.25])
        time.sleep(600)
    return [make_record("echo", {**spec.to_dict(), "i": i}, "ok", {},
                        metrics={"threads": torch.get_num_threads(), "cwd": os.getcwd(),
                                 "marker": os.environ.get("LMPERF_TEST_MARKER")})
            for i in range(spec.count)]


@pytest.mark.parametrize("launcher", [ChildProcess, WarmChild])
def test_inline_and_child_give_the_same_records_tagged_with_the_job(launcher, tmp_path,
                                                                      monkeypatch):
    # The parent's working directory and environment at the time of the job apply, also for a
    # warm child whose server was started earlier, elsewhere.
    WarmChild(EchoSpec(count=1)).run()  # the server is running before the change
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LMPERF_TEST_MARKER", "now")
    spec = EchoSpec(count=3)
    inline, child = run_inline(spec), launcher(spec).run()
    assert [r["spec"]["i"] for r in child] == [0, 1, 2]
    assert {r["job_id"] for r in inline + child} == {job_id(spec)}
    expected = {"threads": 1, "cwd": str(tmp_path), "marker": "now"}
    assert [r["metrics"] for r in inline] == [r["metrics"] for r in child] == [expected] * 3


@pytest.mark.parametrize("launcher", [ChildProcess, WarmChild])
def test_a_child_that_dies_is_one_error_row_made_by_the_parent(launcher):
    (record,) = launcher(EchoSpec(die=True)).run()
    assert record["status"] == "error" and "SIGABRT" in record["message"]
    assert "1 of 5 steps had finished" in record["message"]
    assert record["progress"]["samples_ms"] == [2.5]
    assert record["job_id"] == job_id(EchoSpec(die=True)) and record["env"]["torch"]


def test_a_warm_child_past_its_timeout_is_killed():
    import time

    start = time.monotonic()
    (record,) = WarmChild(EchoSpec(count=-1), timeout_s=6.0).run()
    assert record["status"] == "error" and "timed out after 6 s" in record["message"]
    assert time.monotonic() - start < 30
    # the row says how far the job got, and keeps what the finished steps measured
    assert "2 of 5 steps had finished in timed steps" in record["message"]
    assert record["progress"]["samples_ms"] == [1.5, 1.25]


def test_job_identity_and_class_path_round_trip():
    spec = EchoSpec(count=5)
    assert resolve(class_path(spec)) is EchoSpec
    assert job_id(spec) == job_id(EchoSpec(count=5)) != job_id(EchoSpec(count=6))


def test_failure_decides_oom_or_error_once():
    stage = Stage("warming up")
    oom = failure(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"), stage)
    assert oom == {"status": "oom", "message": "out of memory while warming up: CUDA out of memory. "
                                              "Tried to allocate 2 GiB"}
    try:
        raise ValueError("bad shape\nsecond line")
    except ValueError as exc:
        err = failure(exc, stage)
    assert err["status"] == "error" and err["message"].startswith("ValueError while warming up")
    assert "Traceback" in err["traceback"]
    assert first_line(ValueError("a\nb")) == "a" and first_line(ValueError()) == "ValueError"


def test_exit_descriptions():
    assert "SIGKILL" in describe_exit(-9) and "OOM killer" in describe_exit(-9)
    assert "exited with code 3" in describe_exit(3)


def test_a_warm_child_dies_with_its_fork_server(tmp_path):
    """Killing the server (as happens when the command that started it is killed outright)
    takes its running children with it (PR_SET_PDEATHSIG), so no job outlives the command."""
    import os
    import signal
    import threading
    import time

    from lmperf.core.launch import ForkServer

    child = WarmChild(EchoSpec(count=-1))  # never ends by itself
    done: list = []
    thread = threading.Thread(target=lambda: done.append(child.run()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while child.pid is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert child.pid is not None
    os.kill(ForkServer.get().proc.pid, signal.SIGKILL)
    thread.join(30)
    assert done and done[0][0]["status"] == "error"
    time.sleep(0.5)
    try:  # gone, or a zombie nobody reaps (its parent, the server, is dead): not running
        state = open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        state = "gone"
    assert state in ("gone", "Z", "X"), state
