"""The device layer on the CPU: device resolution, phase clock, OOM detection, memory peaks."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from lmperf.errors import LmperfError, SpecError
from lmperf.runtime import device as dev

CPU = torch.device("cpu")
SRC = Path(__file__).resolve().parents[2] / "src"

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only expectations")


def run_python(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, timeout=120)


# --- resolve_device ---------------------------------------------------------------------------------

def test_auto_is_cpu_here():
    assert dev.resolve_device("auto") == CPU


def test_cpu():
    assert dev.resolve_device("cpu") == CPU


def test_cuda_without_gpu_raises_spec_error():
    with pytest.raises(SpecError, match="cuda"):
        dev.resolve_device("cuda")


@pytest.mark.parametrize("name", ["gpu", "mps", "CPU", "cuda:0", ""])
def test_unknown_device_raises_spec_error(name):
    with pytest.raises(SpecError, match="unknown device") as info:
        dev.resolve_device(name)
    assert isinstance(info.value, LmperfError) and isinstance(info.value, ValueError)
    for accepted in ("auto", "cpu", "cuda"):
        assert accepted in str(info.value)


# --- PhaseClock ---------------------------------------------------------------------------------------

def test_phase_clock_on_cpu():
    clock = dev.PhaseClock(CPU)
    assert clock.kind == "perf_counter" and not clock.cuda
    clock.start()
    time.sleep(0.01)
    clock.lap("a")
    time.sleep(0.01)
    clock.lap("b")
    assert list(clock.laps) == ["a", "b"]
    assert clock.laps["a"] >= 9.0 and clock.laps["b"] >= 9.0  # milliseconds, not seconds
    assert clock.total_ms == pytest.approx(clock.laps["a"] + clock.laps["b"], abs=1e-6)


def test_phase_clock_start_clears_laps():
    clock = dev.PhaseClock(CPU)
    clock.start()
    clock.lap("forward")
    clock.lap("backward")
    clock.start()
    clock.lap("forward")
    assert list(clock.laps) == ["forward"]
    assert clock.laps["forward"] >= 0
    assert clock.total_ms == pytest.approx(clock.laps["forward"], abs=1e-6)


def test_phase_clock_laps_non_negative():
    clock = dev.PhaseClock(CPU)
    clock.start()
    for phase in ("forward", "backward", "optimizer"):
        clock.lap(phase)
    assert all(v >= 0 for v in clock.laps.values())
    assert clock.total_ms == pytest.approx(sum(clock.laps.values()), abs=1e-6)


# --- is_oom -----------------------------------------------------------------------------------------

def test_memory_error_is_oom():
    assert dev.is_oom(MemoryError())
    assert dev.is_oom(MemoryError("no room"))


def test_torch_out_of_memory_error_is_oom():
    assert dev.is_oom(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))


def test_real_cpu_allocation_failure_is_oom():
    with pytest.raises(Exception) as info:
        torch.empty(2**62, dtype=torch.uint8)  # 4 EiB: the allocator refuses
    assert isinstance(info.value, RuntimeError)
    assert dev.is_oom(info.value)


def test_cuda_oom_text_is_oom():
    assert dev.is_oom(RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"))


@pytest.mark.parametrize("exc", [
    ValueError("can't allocate memory"),  # right words, wrong type
    ValueError("bad value"),
    RuntimeError("shape mismatch"),
    RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"),
    KeyError("x"),
    OSError("disk full"),
])
def test_other_errors_are_not_oom(exc):
    assert not dev.is_oom(exc)


def test_a_cpu_cap_under_what_the_process_maps_is_refused_in_one_line():
    # A CUDA build of torch maps ~3 GiB at import: a 1.5 GiB cap made every run die (SIGABRT,
    # "Cannot load symbol cudnnGetVersion") instead of running out of memory. In a child: a
    # cap that was not refused could not be lifted again.
    proc = run_python("""
        import torch
        from lmperf.runtime import device as dev
        try:
            dev.cap_memory(torch.device("cpu"), dev.address_space_bytes() / 2**31)
        except Exception as exc:
            print(type(exc).__name__, exc)
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("SpecError --max-memory-gib"), proc.stdout
    assert "GiB before the run starts" in proc.stdout and "give more than" in proc.stdout


def test_cap_memory_makes_allocation_fail_cleanly():
    # Never in the pytest process: RLIMIT_AS cannot be raised again once lowered.
    proc = run_python("""
        import torch
        from lmperf.runtime import device as dev
        gib = round(dev.address_space_bytes() / 2**30 + 1.4)  # 2 over a CPU build's import
        desc = dev.cap_memory(torch.device("cpu"), gib)
        print("CAP", desc, f"[{gib:g} GiB]")
        try:
            torch.empty(4 * 10**9, dtype=torch.uint8).fill_(1)
        except BaseException as exc:
            print("RAISED", type(exc).__name__, dev.is_oom(exc))
        else:
            print("NOT RAISED")
        t = torch.ones(1000)          # the process is still usable after the failure
        print("STILL", int(t.sum()))
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert any(line.startswith("CAP ") and "RLIMIT_AS" in line
               and f"capped at {line.split('[')[-1].split()[0]} GiB" in line for line in lines)
    assert "RAISED RuntimeError True" in lines or "RAISED MemoryError True" in lines, proc.stdout
    assert "STILL 1000" in lines


# --- PeakMemory -------------------------------------------------------------------------------------

def test_peak_memory_cpu_kind():
    pm = dev.PeakMemory(CPU)
    assert pm.kind == "cpu_process_peak_rss" and not pm.cuda


def test_peak_memory_rises_with_an_allocation():
    pm = dev.PeakMemory(CPU)
    pm.reset()
    if not pm.resettable:
        pytest.skip("/proc/self/clear_refs is not writable here: the peak is cumulative")
    before = pm.read()
    assert set(before) == {"rss"}
    assert before["rss"] is not None and before["rss"] > 0
    big = torch.ones(50 * 2**20)  # 200 MiB of float32, every page touched
    after = pm.read()["rss"]
    assert after - before["rss"] >= 150
    del big
    pm.reset()  # a new window starts at the current (smaller) resident set
    assert pm.read()["rss"] < after - 100


# --- small helpers ------------------------------------------------------------------------------------

def test_cpu_model_is_a_string():
    name = dev.cpu_model()
    assert isinstance(name, str) and name.strip()
    assert dev.device_name(CPU) == name


def test_fused_adamw_supported_on_cpu():
    assert dev.fused_adamw_supported(CPU) is True


def test_bf16_supported_on_cpu():
    assert dev.bf16_supported(CPU) is True


def test_cuda_versions_on_cpu_build():
    v = dev.cuda_versions()
    assert set(v) == {"cuda", "cudnn"}
    assert v["cuda"] == torch.version.cuda


def test_synchronize_and_free_memory_are_no_ops_on_cpu():
    x = torch.arange(4.0)
    assert dev.synchronize(CPU) is None and dev.free_memory(CPU) is None
    assert torch.equal(x, torch.arange(4.0))  # nothing held or freed on the CPU
    assert not torch.cuda.is_initialized()  # and CUDA left alone, even on a CUDA build


def test_make_generator_is_reproducible():
    a = torch.randint(0, 100, (8,), generator=dev.make_generator(CPU, 3))
    b = torch.randint(0, 100, (8,), generator=dev.make_generator(CPU, 3))
    c = torch.randint(0, 100, (8,), generator=dev.make_generator(CPU, 4))
    assert torch.equal(a, b) and not torch.equal(a, c)
