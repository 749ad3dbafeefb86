"""The doctor's memory-cap check (issue 19, finding 3): it passes only when the small
allocation fitted and the large one failed as 'oom', and the CPU cap is sized from the child's
own address space after import (a CUDA build of torch maps several GiB there)."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import pytest
import torch

from lmperf.questions.doctor import capjob
from lmperf.questions.doctor.checks import Context
from lmperf.units import GIB

CPU_CAP = "process address space capped at 1.6875 GiB (RLIMIT_AS)"
CPU_OOM = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 67108864 bytes"


@pytest.fixture
def ctx(tmp_path: Path) -> Context:
    return Context(torch.device("cpu"), tmp_path)


def _check(ctx: Context, record: dict):
    done: Future = Future()
    done.set_result([record])
    ctx.launched[capjob.start_cap_job] = done
    return capjob.check_cap(ctx)


def test_an_oom_at_the_small_allocation_is_a_failure(ctx, monkeypatch):
    # A cap below what the process already maps fails the first allocation: the job's own
    # record (run here, in-process, with that allocation failing) must not pass the check.
    real_ones = torch.ones

    def ones(*args, **kwargs):
        raise RuntimeError(CPU_OOM)

    monkeypatch.setattr(torch, "ones", ones)
    record = capjob.run_alloc(capjob.AllocSpec(device="cpu", gib=2.0))
    monkeypatch.setattr(torch, "ones", real_ones)
    assert record["status"] == "oom" and record["failed_at"] == "small"
    assert record["message"].startswith(f"out of memory while allocating {capjob.SMALL_MIB} MiB")
    out = _check(ctx, {**record, "memory_cap": CPU_CAP})
    assert out.status == "fail", out
    assert "64 MiB" in out.result


def test_an_oom_at_the_large_allocation_passes(ctx):
    record = {"status": "oom", "failed_at": "large", "memory_cap": CPU_CAP,
              "message": f"out of memory while allocating 2 GiB: {CPU_OOM}"}
    out = _check(ctx, record)
    assert out.status == "ok", out
    assert "at the 2 GiB allocation" in out.result and "RLIMIT_AS" in out.result


def test_without_a_cap_or_a_stage_it_fails(ctx):
    assert _check(ctx, {"status": "oom", "failed_at": "large", "message": "x"}).status == "fail"
    assert _check(ctx, {"status": "oom", "memory_cap": CPU_CAP,
                        "message": "out of memory while allocating 2 GiB: x"}).status == "fail"


def test_the_job_records_its_address_space_and_what_fitted():
    record = capjob.run_alloc(capjob.AllocSpec(device="cpu", gib=0.0))
    assert record["status"] == "ok" and record["failed_at"] is None
    assert 0.1 < record["address_space_gib"] < 1024  # torch is imported: far from nothing


class FakeChild:
    """Stands in for core.launch.ChildProcess: records each launch, answers from `replies`."""

    launches: list[tuple[capjob.AllocSpec, float | None]] = []
    replies: list[list[dict]] = []

    def __init__(self, spec, timeout_s=None, max_memory_gib=None):
        self.spec, self.cap = spec, max_memory_gib

    def run(self) -> list[dict]:
        FakeChild.launches.append((self.spec, self.cap))
        return FakeChild.replies.pop(0)


@pytest.fixture
def fake_child(monkeypatch):
    FakeChild.launches, FakeChild.replies = [], []
    monkeypatch.setattr("lmperf.core.launch.ChildProcess", FakeChild)
    return FakeChild


def test_the_cpu_cap_is_sized_from_the_childs_address_space(ctx, fake_child, monkeypatch):
    # A CUDA build maps ~4 GiB at import: a fixed 1.5 GiB cap would fail every allocation.
    asked = []
    monkeypatch.setattr("lmperf.core.capfloor.floor_bytes",
                        lambda warm: asked.append(warm) or int(4.2 * GIB))
    fake_child.replies = [[{"status": "oom", "failed_at": "large"}]]
    records = capjob.start_cap_job(ctx)()
    assert records == [{"status": "oom", "failed_at": "large"}]
    assert asked == [False]  # an uncapped child launched cold, as the capped one is
    [(job, cap)] = fake_child.launches
    assert cap == pytest.approx(5.25)  # 4.2 + 1 GiB of headroom, up to 1/16 GiB
    assert job.gib == 2 * capjob.HEADROOM_GIB  # more than the headroom leaves


def test_an_unmeasured_floor_is_the_answer(ctx, fake_child, monkeypatch):
    monkeypatch.setattr("lmperf.core.capfloor.floor_bytes", lambda warm: None)
    records = capjob.start_cap_job(ctx)()
    assert records[0]["status"] == "error" and fake_child.launches == []
    assert _check(ctx, records[0]).status == "fail"


def test_cuda_keeps_its_allocator_cap(tmp_path, fake_child):
    fake_child.replies = [[{"status": "oom", "failed_at": "large"}]]
    capjob.start_cap_job(Context(torch.device("cuda"), tmp_path))()
    assert fake_child.launches == [(capjob.AllocSpec("cuda", 2.0), capjob.CAP_GIB["cuda"])]
