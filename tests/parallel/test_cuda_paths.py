"""CUDA paths of `lmperf dist`, checked on the CPU with the CUDA runtime faked at its edge.

torch.cuda's Python layer runs for real; only the calls into the CUDA runtime (the current
device, set_device, device properties, the C++ memory-fraction setter) are stand-ins for a
machine with two 80 GiB GPUs. Issue 19, finding 1: the rank's memory cap went to GPU 0.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.cuda.memory

from lmperf.core import rank as worker

GIB = 2**30


@pytest.fixture
def two_gpus(monkeypatch):
    """Two GPUs, current device 0 until `torch.cuda.set_device` changes it; `.fractions` lists
    the (fraction, index) pairs the memory cap set."""
    current = {"index": 0}
    fractions: list[tuple[float, int]] = []
    props = SimpleNamespace(name="NVIDIA A100-SXM4-80GB", major=8, minor=0, total_memory=80 * GIB)

    def set_device(device):
        current["index"] = device.index if isinstance(device, torch.device) else int(device)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current["index"])
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    monkeypatch.setattr(torch.cuda.memory, "_lazy_init", lambda: None)
    monkeypatch.setattr(torch._C, "_cuda_setMemoryFraction",
                        lambda fraction, index: fractions.append((fraction, index)), raising=False)
    return SimpleNamespace(current=current, fractions=fractions)


@pytest.mark.parametrize("local_rank", [0, 1])
def test_each_rank_caps_its_own_gpu(two_gpus, local_rank):
    job = SimpleNamespace(device="cuda", max_memory_gib=20.0)
    device = worker.rank_device(job, local_rank)
    assert device == torch.device("cuda", local_rank)
    assert two_gpus.current["index"] == local_rank  # selected: NCCL uses the current device
    assert two_gpus.fractions == [(pytest.approx(20 / 80), local_rank)]


def test_no_cap_without_max_memory(two_gpus):
    device = worker.rank_device(SimpleNamespace(device="cuda", max_memory_gib=None), 1)
    assert device == torch.device("cuda", 1) and two_gpus.fractions == []


def test_cpu_ranks_get_the_cpu(monkeypatch):
    capped = []
    monkeypatch.setattr("lmperf.runtime.device.memory.resource.setrlimit",
                        lambda kind, limits: capped.append(limits))
    from lmperf.runtime.device import address_space_bytes

    gib = round(address_space_bytes() / GIB + 1)  # over what this (long) pytest process maps
    device = worker.rank_device(SimpleNamespace(device="cpu", max_memory_gib=gib), 1)
    assert device == torch.device("cpu") and capped == [(int(gib * GIB), int(gib * GIB))]


def test_a_rank_refused_its_memory_cap_is_a_row_saying_why():
    # before: "rank 0 died (exit code 1) while importing torch", the reason left in the log
    import lmperf

    report = lmperf.dist("comm", world_size=2, collective="all_reduce", sizes="1KiB", iters=2,
                         warmup=1, device="cpu", max_memory_gib=0.3)
    assert [r["status"] for r in report.records] == ["error"]
    assert "--max-memory-gib 0.3 caps" in report.records[0]["message"]
    assert "give more than" in report.records[0]["message"]
