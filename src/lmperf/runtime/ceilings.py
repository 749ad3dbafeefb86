"""The device's own ceilings, measured: attained matmul FLOP/s per dtype, memory bandwidth, and
the overhead of one eager op.

Datasheets give peaks (`runtime.peaks`); this module measures what the device attains here, in
this process, with this thread count: a square matmul per dtype, large enough to be the
device's cost rather than the call's (each size warmed up before it is judged), a copy and a
STREAM triad, and `torch.add` on one-element tensors. Best of `REPEATS`, each closed by a device
synchronisation. The method and why: docs/commands/profile.md, "Roofline".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from lmperf.runtime import device as dev
from lmperf.runtime.lowp import DTYPES
from lmperf.units import GIB, MIB

MIN_CALL_S = 0.02  # one matmul call at least this long: timer and launch costs stay < 1%
REPEATS = 3
# Largest n tried: CPU (a 2048^3 fp32 product is 17 GFLOP, ~0.3 s at one thread) and CUDA.
MAX_N = {"cpu": 2048, "cuda": 8192}
# Smallest n judged: a 4096^3 product keeps every SM of an H100/H200 busy for ~0.1 ms in bf16
# (~2 ms in fp32), long past the launch; smaller ones cannot reach the peak they would measure.
MIN_N = {"cpu": 128, "cuda": 4096}
# Bandwidth buffers: 64 MiB each on the CPU (far above any L3 slice of this project's machines;
# three of them for the triad), 1 GiB on CUDA (far above any L2).
STREAM_BYTES = {"cpu": 64 * MIB, "cuda": GIB}
OVERHEAD_CALLS = 1000


@dataclass(frozen=True)
class Ceilings:
    """What the device attained.

    matmul_flops_per_s: dtype name ('fp32', 'bf16', 'fp16') -> attained FLOP/s (square matmul).
    matmul_n: dtype name -> the n of the (n, n) @ (n, n) product that was timed.
    copy_bytes_per_s, triad_bytes_per_s: attained bandwidth of the copy and the triad (bytes
        read + written per second); bandwidth_bytes_per_s: the faster of the two.
    op_overhead_s: seconds per call of a one-element aten op (dispatch / launch cost).
    stream_bytes: the size of each bandwidth buffer (bytes).
    threads: torch's intra-op threads during the measurement (CPU), device_name: what ran it.
    """

    device: str
    device_name: str
    threads: int
    matmul_flops_per_s: dict[str, float] = field(default_factory=dict)
    matmul_n: dict[str, int] = field(default_factory=dict)
    copy_bytes_per_s: float = float("nan")
    triad_bytes_per_s: float = float("nan")
    stream_bytes: int = 0
    op_overhead_s: float = float("nan")

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """The attained memory bandwidth: the faster of copy and triad (bytes/s)."""
        return max(self.copy_bytes_per_s, self.triad_bytes_per_s)

    def flops_per_s(self, dtype: str) -> float | None:
        """Attained matmul FLOP/s in `dtype` ('fp32', 'bf16', 'fp16'); None when not measured."""
        return self.matmul_flops_per_s.get(dtype)

    def to_dict(self) -> dict:
        """The ceilings as a record stores them (bandwidth included)."""
        return asdict(self) | {"bandwidth_bytes_per_s": self.bandwidth_bytes_per_s}

    @classmethod
    def from_dict(cls, data: dict) -> "Ceilings":
        """Back from `to_dict` (derived fields ignored)."""
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in names})


def _best_s(fn, device: torch.device, repeats: int) -> float:
    """Seconds of the fastest of `repeats` calls of `fn`, each closed by a synchronisation."""
    clock = dev.PhaseClock(device)
    best = float("inf")
    for _ in range(repeats):
        clock.start()
        fn()
        clock.lap("call")
        best = min(best, clock.laps["call"] / 1e3)
    return best


def matmul_flops(device: torch.device, dtype: torch.dtype, repeats: int = REPEATS,
                 min_call_s: float = MIN_CALL_S, max_n: int | None = None) -> tuple[float, int]:
    """Attained FLOP/s of a square matmul in `dtype` on `device`, and the n it used.

    n doubles from MIN_N[device] while one call, timed after an untimed one at the same size,
    is shorter than `min_call_s` (so the timed product is large enough to be the device's, not
    the call's, cost) and n < `max_n`; a size that runs out of memory is halved (not below 128).
    """
    max_n = max_n or MAX_N.get(device.type, 2048)
    n = min(MIN_N.get(device.type, 128), max_n)
    while True:
        try:
            a = torch.randn(n, n, device=device).to(dtype)  # (n, n); randn first: any dtype works
            b = torch.randn(n, n, device=device).to(dtype)
            _best_s(lambda: torch.mm(a, b), device, 1)  # warm-up at this size (untimed)
        except Exception as exc:  # noqa: BLE001 - out of memory: a smaller product fits
            if not dev.is_oom(exc) or n <= 128:
                raise
            a = b = None
            dev.free_memory(device)
            n = max_n = n // 2
            continue
        seconds = _best_s(lambda: torch.mm(a, b), device, 1)
        if seconds >= min_call_s or 2 * n > max_n:
            break
        n *= 2
    if repeats > 1:  # the judged call is the first of the `repeats`
        seconds = min(seconds, _best_s(lambda: torch.mm(a, b), device, repeats - 1))
    return 2 * n**3 / seconds, n


def bandwidth(device: torch.device, nbytes: int | None = None,
              repeats: int = REPEATS) -> tuple[float, float, int]:
    """(copy, triad) attained bytes/s over fp32 buffers of `nbytes` each, and `nbytes` (on a GPU
    at most 1/16 of its memory each: the three fit beside a run's tensors)."""
    nbytes = nbytes or STREAM_BYTES.get(device.type, STREAM_BYTES["cpu"])
    total_gib = dev.device_memory_gib(device)
    if total_gib:
        nbytes = min(nbytes, int(total_gib * GIB / 16))
    n = nbytes // 4
    x = torch.ones(n, device=device)  # written once: every page touched before timing
    y = torch.ones(n, device=device)
    z = torch.empty(n, device=device)
    z.fill_(0.0)
    y.copy_(x)  # untimed first pass
    copy_s = _best_s(lambda: y.copy_(x), device, repeats)
    torch.add(x, y, alpha=2.0, out=z)
    triad_s = _best_s(lambda: torch.add(x, y, alpha=2.0, out=z), device, repeats)
    return 2 * n * 4 / copy_s, 3 * n * 4 / triad_s, n * 4


def op_overhead(device: torch.device, calls: int = OVERHEAD_CALLS,
                repeats: int = REPEATS) -> float:
    """Seconds per call of `torch.add` on one-element tensors, one of them requiring grad,
    `calls` calls per timing: the cost of an eager training-step op with no work in it."""
    x = torch.ones(1, device=device, requires_grad=True)
    y = torch.ones(1, device=device)

    def run() -> None:
        with torch.enable_grad():
            for _ in range(calls):
                torch.add(x, y)  # allocates its output and records an AddBackward node

    run()  # warm-up: `calls` untimed calls (allocator blocks cached, autograd node types seen)
    return _best_s(run, device, repeats) / calls


def fresh_write(device: torch.device, nbytes: int = 64 * MIB,
                repeats: int = REPEATS) -> float | None:
    """Bytes/s of the extra a CPU op pays to write a fresh output of `nbytes`: a clone's time
    less a copy into an existing buffer. glibc maps every allocation above its largest mmap
    threshold (32 MiB on 64-bit: `estimate.time_model.MMAP_MAX_BYTES`) afresh and unmaps it
    on free, so each such output is faulted in page by page (2.4-2.5 GB/s on this project's
    EPYC, 40 to 164 MiB). None where a fresh output costs nothing more (an allocator that
    keeps its pages, or the noise of two equal timings)."""
    n = nbytes // 4
    x, y = torch.ones(n, device=device), torch.ones(n, device=device)
    fresh = _best_s(lambda: x.clone(), device, repeats)
    into = _best_s(lambda: y.copy_(x), device, repeats)
    return nbytes / (fresh - into) if fresh > into else None


def measure_ceilings(device: torch.device, dtypes: tuple[str, ...] = ("fp32", "bf16"),
                     repeats: int = REPEATS) -> Ceilings:
    """Measure the attained matmul FLOP/s in each of `dtypes` and the memory bandwidth on
    `device`, with the thread count in force (lmperf's default: one CPU thread). A few seconds
    on a CPU (bf16 without native support is slow, so its n stays small), under a second on a
    GPU after its warm-up. Raises SpecError for an unknown dtype name.
    """
    from lmperf.errors import SpecError

    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown:
        raise SpecError(f"unknown matmul dtype {', '.join(unknown)}; accepted: {', '.join(DTYPES)}")
    flops, sizes = {}, {}
    for name in dtypes:
        flops[name], sizes[name] = matmul_flops(device, DTYPES[name], repeats)
    copy, triad, nbytes = bandwidth(device, repeats=repeats)
    overhead = op_overhead(device, repeats=repeats)
    dev.free_memory(device)
    return Ceilings(device=device.type, device_name=dev.device_name(device),
                    threads=torch.get_num_threads(), matmul_flops_per_s=flops, matmul_n=sizes,
                    copy_bytes_per_s=copy, triad_bytes_per_s=triad, stream_bytes=nbytes,
                    op_overhead_s=overhead)


def datasheet_peaks(device_name: str) -> dict[str, float]:
    """The datasheet peaks of `device_name` from `runtime.peaks`: 'fp32' / 'tf32' / 'bf16' /
    'fp16' -> FLOP/s, and 'bandwidth' -> bytes/s where the table has it; empty for a CPU or a
    device the table does not list (never another device's figures)."""
    from lmperf.runtime.peaks import lookup_peak, spec_for_device_name

    out = {}
    for dtype in ("fp32", "tf32", "bf16", "fp16"):
        if (peak := lookup_peak(device_name, dtype)) is not None:
            out[dtype] = peak.tflops * 1e12
    if (spec := spec_for_device_name(device_name)) is not None:
        out["bandwidth"] = float(spec.memory_bandwidth)
    return out
