"""The device layer: the only module that knows CUDA.

Synchronisation, phase clocks (CUDA events or the host clock), out-of-memory detection, memory
peaks, capability checks and the memory cap. Everything else asks this module and stays testable
on the CPU.
"""

from __future__ import annotations

import contextlib
import re
import resource
import timeit
import torch

from lmperf.errors import SpecError

MIB = 2**20
GIB = 2**30


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available else cpu; 'cuda' without a GPU raises SpecError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda"):
        raise SpecError(f"unknown device {name!r}; accepted: auto, cpu, cuda")
    if name == "cuda" and not torch.cuda.is_available():
        raise SpecError("--device cuda was asked for, but torch sees no CUDA device here")
    return torch.device(name)


def cuda_device_count() -> int:
    """GPUs this process may use (torch respects CUDA_VISIBLE_DEVICES); 0 without CUDA."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def use_cuda_device(index: int) -> torch.device:
    """Make GPU `index` this process's current device (one GPU per local rank: NCCL needs it
    set before its first use); returns it."""
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    return device


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (for experiments that compare CPU and CUDA side by side)."""
    return torch.cuda.is_available()


def nvtx_range(name: str) -> contextlib.AbstractContextManager:
    """An NVTX range for Nsight Systems, or a no-op where NVTX is not usable (e.g. a CPU build,
    whose `torch.cuda.nvtx` raises)."""
    if not torch.cuda.is_available():
        return contextlib.nullcontext()
    try:
        return torch.cuda.nvtx.range(name)
    except (RuntimeError, AttributeError):
        return contextlib.nullcontext()


def cuda_index(device: torch.device) -> int:
    """The CUDA device index of `device`: its own, else the current device's.

    Some torch.cuda functions resolve an index-less `torch.device("cuda")` themselves
    (`_get_device_index(device, optional=True)`: synchronize, the memory statistics,
    get_device_properties), but `set_per_process_memory_fraction` does not and raises
    ValueError for it (torch/cuda/memory.py, torch 2.4 to 2.13). Every call here passes this
    index, so all of them address the same device.
    """
    if device.type != "cuda":
        raise ValueError(f"cuda_index needs a CUDA device, got {device}")
    return device.index if device.index is not None else torch.cuda.current_device()


def synchronize(device: torch.device) -> None:
    """Wait for all queued work on the device (a no-op on the CPU, where ops are synchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(cuda_index(device))


class PhaseClock:
    """Times consecutive phases of one step; every phase is closed by a device synchronisation.

    On CUDA the durations come from CUDA events recorded at the phase boundaries (GPU time, which
    includes launch gaps); on the CPU from `timeit.default_timer` (perf_counter) after the sync.
    Usage: `clock.start()`, then `clock.lap("forward")`, `clock.lap("backward")`, ...;
    `clock.laps` maps phase name -> milliseconds, and `clock.total_ms` is the whole step.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.kind = "cuda_event" if self.cuda else "perf_counter"
        self.laps: dict[str, float] = {}
        self.total_ms = 0.0
        self._marks: list = []

    def _mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(cuda_index(self.device)))  # the run's device
            synchronize(self.device)
            return ev
        return timeit.default_timer()

    @staticmethod
    def _ms(a, b) -> float:
        if isinstance(a, float):
            return (b - a) * 1e3
        return a.elapsed_time(b)  # CUDA events: already milliseconds

    def start(self) -> None:
        """Begin a step: drain the device, then take the first mark."""
        synchronize(self.device)
        self.laps = {}
        self._marks = [self._mark()]

    def lap(self, phase: str) -> None:
        """Close `phase`: synchronise and record its duration since the previous mark."""
        self._marks.append(self._mark())
        self.laps[phase] = self._ms(self._marks[-2], self._marks[-1])
        self.total_ms = self._ms(self._marks[0], self._marks[-1])


# Out-of-memory messages that do not come as torch.OutOfMemoryError (a RuntimeError each):
# - "DefaultCPUAllocator: can't allocate memory" (the CPU allocator, e.g. under RLIMIT_AS);
# - "CUDA out of memory" (the caching allocator's text, kept for torch builds and wrappers that
#   re-raise it as a plain RuntimeError);
# - "CUDA error: out of memory": a CUDA API call that failed with cudaErrorMemoryAllocation
#   outside the caching allocator (context creation, cudaMalloc in a library, a stream or event);
#   torch >= 2.8 raises it as torch.AcceleratorError, older ones as RuntimeError (HIP: "HIP error");
# - cuBLAS / cuSOLVER / cuDNN handles and workspaces that failed to allocate
#   ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`").
_OOM_TEXT = re.compile(r"can't allocate memory|CUDA out of memory|(?:CUDA|HIP) error: out of memory"
                       r"|CUBLAS_STATUS_ALLOC_FAILED|CUSOLVER_STATUS_ALLOC_FAILED"
                       r"|CUDNN_STATUS_ALLOC_FAILED")


def is_oom(exc: BaseException) -> bool:
    """True when `exc` is an out-of-memory error of the CPU, the CUDA caching allocator, the CUDA
    runtime or a CUDA library (cuBLAS, cuSOLVER, cuDNN)."""
    if isinstance(exc, MemoryError):
        return True
    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", ())
    if oom_type and isinstance(exc, oom_type):
        return True
    return isinstance(exc, RuntimeError) and _OOM_TEXT.search(str(exc)) is not None


def free_memory(device: torch.device) -> None:
    """Return cached blocks to the driver (after an OOM, before the next phase of a run)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


class PeakMemory:
    """Per-phase peak memory: CUDA allocator peaks, or the CPU process's peak resident set.

    The CPU figure is the process's VmHWM (peak RSS, reset through /proc/self/clear_refs): it
    includes the Python runtime and torch's own pages, so it is a process-level figure, never a
    GPU-memory figure. Where the reset is not permitted the peak is cumulative and `resettable`
    is False.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.kind = "cuda_allocator" if self.cuda else "cpu_process_peak_rss"
        self.resettable = True

    def reset(self) -> None:
        """Start a new peak window."""
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(cuda_index(self.device))
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # 5: reset the peak RSS (VmHWM) to the current RSS
        except OSError:
            self.resettable = False

    def read(self) -> dict[str, float | None]:
        """Peak since the last reset, in MiB: {'allocated': ..., 'reserved': ...} or {'rss': ...}."""
        if self.cuda:
            index = cuda_index(self.device)
            return {
                "allocated": torch.cuda.max_memory_allocated(index) / MIB,
                "reserved": torch.cuda.max_memory_reserved(index) / MIB,
            }
        return {"rss": _proc_status_kib("VmHWM") * 1024 / MIB if _has_proc() else None}


def _has_proc() -> bool:
    try:
        open("/proc/self/status").close()
        return True
    except OSError:
        return False


def _proc_status_kib(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return float(line.split()[1])
    return float("nan")


def device_name(device: torch.device) -> str:
    """Marketing name of the GPU, or the CPU model name."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(cuda_index(device))
    return cpu_model()


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, or the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown CPU"


def cuda_versions() -> dict[str, str | None]:
    """CUDA runtime and cuDNN versions torch was built with (None on a CPU build)."""
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {"cuda": torch.version.cuda, "cudnn": str(cudnn) if cudnn else None}


def device_memory_gib(device: torch.device) -> float | None:
    """Total memory of a CUDA device in GiB (2**30 bytes); None for any other device."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(cuda_index(device)).total_memory / GIB


def cuda_capability(device: torch.device) -> tuple[int, int] | None:
    """(major, minor) compute capability of a CUDA device; None for any other device."""
    if device.type != "cuda":
        return None
    return tuple(torch.cuda.get_device_capability(cuda_index(device)))  # type: ignore[return-value]


def bf16_supported(device: torch.device) -> bool:
    """Whether `device` does bf16 math natively: on CUDA, compute capability >= 8.0 (Ampere) of
    this very device; ROCm builds support bf16 on every device torch runs on; CPUs do.

    Not `torch.cuda.is_bf16_supported()`: by default it counts emulation (a pre-Ampere GPU that
    can merely hold a bf16 tensor answers True) and it asks about the current device, not this one.
    """
    if device.type != "cuda":
        return True
    if torch.version.hip:
        return True
    major, _ = cuda_capability(device)  # type: ignore[misc]
    return major >= 8


def fused_adamw_supported(device: torch.device) -> bool:
    """Whether `AdamW(fused=True)` runs on this device type (CUDA, and CPU since torch 2.4).

    torch's own list of devices with fused optimizer kernels answers without running anything
    (a probe step costs ~1.3 s of lazy imports, and would initialise CUDA in the caller); where
    that private helper is missing, one tiny fused step is tried.
    """
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        return device.type in _get_fused_kernels_supported_devices()
    except (ImportError, AttributeError):
        pass
    params = [torch.nn.Parameter(torch.zeros(2, device=device))]
    params[0].grad = torch.zeros(2, device=device)
    try:
        torch.optim.AdamW(params, fused=True).step()
    except (RuntimeError, ValueError, TypeError):
        return False
    return True


def set_tf32(enabled: bool) -> None:
    """Allow or forbid TF32 for fp32 matmuls and cuDNN convolutions (harmless on a CPU build).

    Matmuls go through `torch.set_float32_matmul_precision` only: mixing it with the legacy
    `allow_tf32` flag leaves torch >= 2.9 unable to report its precision.
    """
    torch.set_float32_matmul_precision("high" if enabled else "highest")
    torch.backends.cudnn.allow_tf32 = enabled


def get_tf32() -> tuple[str, bool]:
    """The (float32 matmul precision, cuDNN allow_tf32) pair, for `restore_tf32`."""
    return torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32


def restore_tf32(saved: tuple[str, bool]) -> None:
    """Put back what `get_tf32` returned."""
    torch.set_float32_matmul_precision(saved[0])
    torch.backends.cudnn.allow_tf32 = saved[1]


def tf32_state() -> dict[str, object]:
    """The TF32 / float32 matmul precision settings in force (a setting torch cannot report,
    e.g. after a user mixed its legacy and new APIs, is recorded as the error's text)."""
    readers = {
        "float32_matmul_precision": torch.get_float32_matmul_precision,
        "cuda_matmul_allow_tf32": lambda: torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": lambda: torch.backends.cudnn.allow_tf32,
    }
    state: dict[str, object] = {}
    for key, read in readers.items():
        try:
            state[key] = read()
        except RuntimeError as exc:
            state[key] = f"unreadable: {str(exc).splitlines()[0][:120]}"
    return state


def cap_memory(device: torch.device, gib: float) -> str:
    """Cap this process's memory so that running out is a clean, catchable OOM.

    CUDA: the caching allocator's per-process fraction of the GPU. CPU: the address-space limit
    (RLIMIT_AS), which also counts the ~0.6 GiB that Python and torch map at import.
    Returns a description of the cap that was set.
    """
    if device.type == "cuda":
        index = cuda_index(device)  # set_per_process_memory_fraction refuses an index-less device
        total = torch.cuda.get_device_properties(index).total_memory
        fraction = float(min(1.0, gib * GIB / total))
        torch.cuda.set_per_process_memory_fraction(fraction, index)
        return f"CUDA allocator capped at {gib:g} GiB ({fraction:.1%} of cuda:{index})"
    limit = int(gib * GIB)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return f"process address space capped at {gib:g} GiB (RLIMIT_AS)"


def seed_all(seed: int) -> None:
    """Seed torch's CPU and (where present) CUDA generators."""
    torch.manual_seed(seed)  # also seeds every CUDA device


def make_generator(device: torch.device, seed: int) -> torch.Generator:
    """A generator on `device` seeded with `seed` (for reproducible random batches)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


# --- CUDA memory history, snapshots and the OOM dump ---------------------------------------------
# The caching allocator's history recorder and snapshot dump are private torch APIs whose keyword
# form has not changed since the string-valued API of torch 2.1 (checked in torch 2.13's
# torch/cuda/memory.py; 2.13 only adds keywords after these):
#   _record_memory_history(enabled="all"|"state"|None, context="all"|"alloc"|"state"|None,
#                          stacks="python"|"all", max_entries=int, ...)
#   _dump_snapshot(filename)  -> pickle.dump(_snapshot(), f), the file pytorch.org/memory_viz reads
# and the OOM hook `torch._C._cuda_attach_out_of_memory_observer(fn)` (torch/csrc/cuda/Module.cpp),
# which calls fn(device, alloc, device_allocated, device_free) just before the allocator raises
# OutOfMemoryError. None of them exists on a CPU build; every function below is a no-op there.

# Imported here rather than in the header so that this section stays a pure append.
import os  # noqa: E402
from pathlib import Path  # noqa: E402

SNAPSHOT_MAX_ENTRIES = 100_000
"""Alloc/free events kept by the history ring buffer (torchtitan's value; older ones are dropped)."""


def memory_history_unsupported_reason(device: torch.device) -> str | None:
    """Why allocator history and snapshots cannot be taken on `device`, or None when they can."""
    if device.type != "cuda":
        return (f"memory history and snapshots are CUDA only (the CUDA caching allocator records "
                f"them); this run is on the {device.type}")
    if not torch.cuda.is_available():
        return "memory history and snapshots are CUDA only, and torch sees no CUDA device here"
    return None


def start_memory_history(device: torch.device, max_entries: int = SNAPSHOT_MAX_ENTRIES,
                         context: str = "all", stacks: str = "python") -> bool:
    """Start recording every alloc/free of the CUDA allocator with its stack; False on the CPU.

    context="all" keeps the stack of frees too; stacks="python" keeps Python frames only
    ("all" adds C++ frames: bigger files and ~50 ns per frame more per event). Recording is
    process-wide (all CUDA devices), whatever `device` says.
    """
    if memory_history_unsupported_reason(device):
        return False
    torch.cuda.memory._record_memory_history(enabled="all", context=context, stacks=stacks,
                                             max_entries=max_entries)
    return True


def stop_memory_history(device: torch.device) -> bool:
    """Stop recording allocator history; False on the CPU. Stopping drops the recorded events
    (the allocator clears its ring buffer), so dump first."""
    if memory_history_unsupported_reason(device):
        return False
    torch.cuda.memory._record_memory_history(enabled=None)
    return True


def dump_memory_snapshot(device: torch.device, path: str | os.PathLike) -> bool:
    """Write the allocator's snapshot (segments + recorded history) as a pickle to `path`.

    The file opens in pytorch.org/memory_viz. Returns False (and writes nothing) on the CPU.
    """
    if memory_history_unsupported_reason(device):
        return False
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    torch.cuda.memory._dump_snapshot(str(path))
    return True


# torch has no way to detach an OOM observer, so one observer is attached per process and
# `on_oom_dump` only re-points it; a sweep arming it once per run does not stack observers.
_oom_dump: dict[str, object] = {"path": None, "attached": False, "dumps": 0}


def _dump_on_oom(device: int, alloc: int, device_allocated: int, device_free: int) -> None:
    path = _oom_dump["path"]
    if path is None:
        return
    try:
        dump_memory_snapshot(torch.device("cuda", device), str(path))
        _oom_dump["dumps"] = int(_oom_dump["dumps"]) + 1  # type: ignore[call-overload]
    except Exception:  # noqa: BLE001 - the OOM itself must surface, not a failed dump
        pass


def on_oom_dump(device: torch.device, path: str | os.PathLike) -> bool:
    """Dump a snapshot to `path` when the CUDA allocator runs out of memory (until
    `cancel_oom_dump`). The allocator may call it several times for one failing step (e.g. a
    retry with a smaller workspace): the last dump wins. False on the CPU or when this torch
    has no OOM observer hook."""
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if memory_history_unsupported_reason(device) or attach is None:
        return False
    _oom_dump["path"] = str(path)
    if not _oom_dump["attached"]:
        attach(_dump_on_oom)
        _oom_dump["attached"] = True
    return True


def cancel_oom_dump() -> None:
    """Stop dumping on OOM (the observer stays attached but does nothing)."""
    _oom_dump["path"] = None


def oom_dumps() -> int:
    """How many snapshots the OOM observer has written in this process."""
    return int(_oom_dump["dumps"])  # type: ignore[call-overload]


# --- Kernel timing in the style of triton.testing.do_bench, and allocated bytes -------------------
# For `lmperf attention`: one call of a kernel is too short for PhaseClock's per-phase sync, so
# each timed call sits between two CUDA events, after the L2 cache has been overwritten (as
# do_bench does with a 256 MB buffer), so no call finds its inputs warm in L2 from the last one.

L2_FLUSH_MIN_BYTES = 256 * 2**20


def l2_flush_buffer(device: torch.device) -> torch.Tensor | None:
    """A CUDA buffer at least twice the L2 cache (>= 256 MiB) whose `zero_()` evicts L2; None on
    the CPU."""
    if device.type != "cuda":
        return None
    l2 = getattr(torch.cuda.get_device_properties(cuda_index(device)), "L2_cache_size", 0) or 0
    return torch.empty(max(L2_FLUSH_MIN_BYTES, 2 * l2) // 4, dtype=torch.int32, device=device)


def time_cuda_calls(fn, device: torch.device, warmup: int, repeats: int,
                    grad_to_none: list[torch.Tensor] | tuple = ()) -> list[float]:
    """Milliseconds of each of `repeats` calls of `fn()` on CUDA, after `warmup` untimed calls.

    Before each timed call the L2 cache is flushed and the `.grad` of `grad_to_none` reset (so a
    backward does not time gradient accumulation); the flush lies outside the events. One
    synchronisation at the end: the calls queue back to back, as in do_bench.
    """
    if device.type != "cuda":
        raise ValueError("time_cuda_calls needs a CUDA device; time CPU calls with PhaseClock")
    flush = l2_flush_buffer(device)
    stream = torch.cuda.current_stream(cuda_index(device))  # the events time the run's device
    for _ in range(warmup):
        fn()
    synchronize(device)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(repeats)]
    for start, end in events:
        for t in grad_to_none:
            t.grad = None
        flush.zero_()
        start.record(stream)
        fn()
        end.record(stream)
    synchronize(device)
    return [start.elapsed_time(end) for start, end in events]


def memory_allocated(device: torch.device) -> int | None:
    """Bytes held by live tensors in the CUDA caching allocator; None on the CPU (no allocator
    that counts them: the CPU figures come from saved-tensor accounting instead)."""
    if device.type != "cuda":
        return None
    synchronize(device)
    return torch.cuda.memory_allocated(cuda_index(device))
