"""Memory on the device: out-of-memory detection, per-phase peaks (CUDA allocator or the CPU
process's peak RSS), the memory cap, allocated bytes."""

from __future__ import annotations

import re
import resource

import torch

from lmperf.runtime.device.select import cuda_index, synchronize
from lmperf.units import GIB, MIB


# Out-of-memory messages that do not come as torch.OutOfMemoryError (a RuntimeError each): the
# CPU allocator's ("can't allocate memory", e.g. under RLIMIT_AS); the caching allocator's text
# re-raised as a plain RuntimeError; a CUDA API call outside the allocator that failed with
# cudaErrorMemoryAllocation ("CUDA error: out of memory": context, library cudaMalloc, stream;
# torch >= 2.8 raises torch.AcceleratorError; HIP says "HIP error"); cuBLAS / cuSOLVER / cuDNN
# handles and workspaces (`*_STATUS_ALLOC_FAILED`); NCCL's own buffers, whose DistBackendError
# ends with NCCL's last warning (c10d NCCLUtils.cpp getNcclErrorDetailStr): "Cuda failure 2 'out
# of memory'" (CUDACHECK; older NCCL without the number), "Failed to CUDA calloc [async] N bytes"
# or "Failed to malloc N bytes" (alloc.h). Other NCCL errors (a peer that left) stay errors.
_OOM_TEXT = re.compile(r"can't allocate memory|CUDA out of memory|(?:CUDA|HIP) error: out of memory"
                       r"|CUBLAS_STATUS_ALLOC_FAILED|CUSOLVER_STATUS_ALLOC_FAILED"
                       r"|CUDNN_STATUS_ALLOC_FAILED"
                       r"|Cuda failure (?:\d+ )?'out of memory'|Failed to CUDA calloc"
                       r"|Failed to malloc \d+ bytes")


def is_oom(exc: BaseException) -> bool:
    """True when `exc` is an out-of-memory error of the CPU, the CUDA caching allocator, the CUDA
    runtime, a CUDA library (cuBLAS, cuSOLVER, cuDNN) or NCCL's own buffers."""
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
        kib = _proc_status_kib("VmHWM")
        return {"rss": None if kib is None else kib * 1024 / MIB}


def _proc_status_kib(field: str) -> float | None:
    """A field of /proc/self/status, in KiB; None without /proc or without that field."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return float(line.split()[1])
    except OSError:
        pass
    return None


def address_space_bytes() -> int | None:
    """This process's virtual address space (VmSize) in bytes, what RLIMIT_AS limits; None
    without /proc. A CUDA build of torch maps several times more at import than a CPU build."""
    kib = _proc_status_kib("VmSize")
    return None if kib is None else int(kib * 1024)


def device_memory_gib(device: torch.device) -> float | None:
    """Total memory of a CUDA device in GiB (2**30 bytes); None for any other device."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(cuda_index(device)).total_memory / GIB


def cap_memory(device: torch.device, gib: float) -> str:
    """Cap this process's memory so that running out is a clean, catchable OOM.

    CUDA: the caching allocator's per-process fraction of the GPU. Only memory that goes through
    the allocator counts against it: the CUDA context (hundreds of MiB per process and device),
    cuBLAS / cuDNN handles and workspaces, and NCCL's buffers
    (cudaMalloc'd by NCCL itself) come on top, so a process can hold more than the cap, and
    running out there raises a CUDA, cuBLAS or NCCL error that `is_oom` still calls 'oom'.
    CPU: the address-space limit (RLIMIT_AS), which also counts everything the process has
    mapped: ~0.94 GiB in a job of a CPU build of torch, several GiB for a CUDA build (the
    sweep refuses a cap under it before anything runs: core.capfloor).
    Returns a description of the cap that was set.
    """
    if device.type == "cuda":
        index = cuda_index(device)  # set_per_process_memory_fraction refuses an index-less device
        total = torch.cuda.get_device_properties(index).total_memory
        fraction = float(min(1.0, gib * GIB / total))
        torch.cuda.set_per_process_memory_fraction(fraction, index)
        return f"CUDA allocator capped at {gib:g} GiB ({fraction:.1%} of cuda:{index})"
    if torch.version.cuda is not None:  # a CUDA build loads cuDNN on the env capture's query:
        try:                             # load it now, under no cap (under one, it died: SIGABRT)
            torch.backends.cudnn.version()
        except Exception:  # noqa: BLE001 (a cuDNN version mismatch: the capture says it later)
            pass
    limit, mapped = int(gib * GIB), address_space_bytes() or 0
    if limit <= mapped + 256 * MIB:  # at or over the cap already: the job would die, not run out
        from lmperf.errors import SpecError

        raise SpecError(f"--max-memory-gib {gib:g} caps the process's address space on the CPU "
                        f"(RLIMIT_AS), and it maps {mapped / GIB:.2f} GiB before the run starts "
                        f"(torch {torch.__version__}; a CUDA build maps several GiB at import): "
                        f"give more than {mapped / GIB + 0.25:.1f}, e.g. {mapped / GIB + 1:.1f}")
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return f"process address space capped at {gib:g} GiB (RLIMIT_AS)"


def capped_room(device: torch.device) -> list[tuple[int, str]]:
    """(bytes this process may still take, what limits them) from the device and `cap_memory`'s
    cap: CUDA's free memory, and what the allocator's fraction leaves (torch >= 2.6 reads the
    fraction back; older ones cannot); on the CPU what RLIMIT_AS leaves of the address space."""
    if device.type == "cuda":
        index = cuda_index(device)
        free, total = torch.cuda.mem_get_info(index)
        room = [(free, f"free on cuda:{index}")]
        get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
        fraction = get_fraction(index) if get_fraction is not None else 1.0
        if fraction < 1.0:
            room.append((int(fraction * total) - torch.cuda.memory_reserved(index),
                         "under --max-memory-gib"))
        return room
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    mapped = address_space_bytes()
    if soft == resource.RLIM_INFINITY or mapped is None:
        return []
    return [(max(0, soft - mapped), "under --max-memory-gib")]


def memory_allocated(device: torch.device) -> int | None:
    """Bytes held by live tensors in the CUDA caching allocator; None on the CPU (no allocator
    that counts them: the CPU figures come from saved-tensor accounting instead)."""
    if device.type != "cuda":
        return None
    synchronize(device)
    return torch.cuda.memory_allocated(cuda_index(device))
