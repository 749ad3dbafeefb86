"""A rank that crashes, raises or hangs is a row naming it; the sweep goes on; nothing is left."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lmperf.core.torchrun import run_job
from lmperf.questions.parallel.spec import CommJob
from lmperf.core.rank import ENV_FAULT


TAG = f"LMPERF_TEST_FAULTS={os.getpid()}".encode()  # ranks inherit it: this test's, not a
# parallel test run's


@pytest.fixture(autouse=True)
def _tagged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(*TAG.decode().split("="))


def _workers() -> list[int]:
    """Live processes running lmperf's rank entry point that this test process launched
    (orphans included: they keep its environment)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes()
            tagged = b"lmperf.core.rank" in cmdline and TAG in (entry / "environ").read_bytes()
        except OSError:
            continue
        if entry.name.isdigit() and tagged:
            pids.append(int(entry.name))
    return pids


def _job(*sizes: int, timeout: float = 120.0) -> CommJob:
    return CommJob(world_size=2, collectives=("all_reduce",), sizes=sizes, warmup=0, iters=1,
                   timeout_s=timeout)


def test_crash_and_exception_become_rows_and_the_sweep_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_FAULT, "crash@1@all_reduce:2048,raise@0@all_reduce:4096")
    records = run_job(_job(1024, 2048, 4096, 8192))
    status = {r["spec"]["size_bytes"]: r for r in records}
    assert [r["spec"]["size_bytes"] for r in records] == [1024, 2048, 4096, 8192]
    assert status[1024]["status"] == "ok" and status[8192]["status"] == "ok"  # relaunched after
    crash = status[2048]
    assert crash["status"] == "error" and crash["failed_rank"] == 1
    assert "rank 1 died" in crash["message"] and "SIGSEGV" in crash["message"]
    assert "injected crash" in crash["message"]  # the stage the rank was in
    assert any("Segmentation fault" in line for line in crash["log_tail"])  # its faulthandler dump
    raised = status[4096]
    assert raised["status"] == "error" and raised["failed_rank"] == 0
    assert raised["message"].startswith("rank 0: RuntimeError while injected raise: injected failure")
    assert any("injected failure" in line for line in raised["log_tail"])
    assert not _workers()


def test_a_hung_rank_is_killed_and_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_FAULT, "hang@1@all_reduce:1024")
    # 12 s: long enough for the ranks to import torch on a loaded 2-core machine
    [record] = run_job(_job(1024, timeout=12.0))
    assert record["status"] == "error" and record["failed_rank"] == 1
    assert "timed out after 12 s in all_reduce:1024: rank 1 hung at 'injected hang'" in record["message"]
    assert "rank(s) 0 waited" in record["message"]
    assert not _workers()  # every rank was killed, not left hanging
    assert os.environ[ENV_FAULT]  # (the fault stayed scoped to this test)


def test_a_hung_rank_at_world_size_1_names_no_waiting_peers() -> None:
    from types import SimpleNamespace

    from lmperf.core.torchrun import _hang_message

    states = {0: {"rank": 0, "stage": "step 1", "index": 3, "seq": 7}}
    message = _hang_message(SimpleNamespace(timeout_s=30.0), "train", states)
    assert message == ("timed out after 30 s in train: rank 0 hung at 'step 1'; "
                       "every process was killed")
