"""The device layer: the only package that knows CUDA.

Everything else asks it and stays testable on the CPU. One module per job: `select` (which
device, synchronisation, NVTX), `clocks` (phase timing), `memory` (OOM detection, peaks, the
cap), `info` (names, capability, bf16, float8, fused AdamW), `state` (TF32 and RNG), `snapshot` (CUDA
memory history and the OOM dump), `kernel_timer` (do_bench-style per-call timing), `gpu_env`
(driver, NCCL, clocks, power, ECC and other processes, through NVML). Every name
is re-exported here, so `from lmperf.runtime import device as dev; dev.synchronize(...)` works;
a test that replaces a function used inside the package patches the submodule that defines it.
"""

from __future__ import annotations

from lmperf.runtime.device.clocks import PhaseClock
from lmperf.runtime.device.gpu_env import gpu_environment, nccl_version
from lmperf.runtime.device.info import (
    bf16_supported, cpu_model, cuda_capability, cuda_versions, device_name,
    float8_unsupported_reason, fused_adamw_supported,
)
from lmperf.runtime.device.kernel_timer import L2_FLUSH_MIN_BYTES, l2_flush_buffer, time_cuda_calls
from lmperf.runtime.device.memory import (
    PeakMemory, address_space_bytes, cap_memory, capped_room, device_memory_gib, free_memory,
    is_oom, memory_allocated,
)
from lmperf.runtime.device.select import (
    cuda_available, cuda_device_count, cuda_index, nvtx_range, resolve_device, synchronize,
    use_cuda_device,
)
from lmperf.runtime.device.snapshot import (
    SNAPSHOT_MAX_ENTRIES, cancel_oom_dump, dump_memory_snapshot, memory_history_unsupported_reason,
    on_oom_dump, oom_dumps, start_memory_history, stop_memory_history,
)
from lmperf.runtime.device.state import (
    get_tf32, make_generator, restore_tf32, seed_all, set_tf32, tf32_state,
)
