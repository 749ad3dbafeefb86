"""Does this CPU run low-precision matmuls natively? Its flags, and a measured matmul ratio.

Without native bf16 (no avx512_bf16 / AMX), torch's bf16 matmuls convert in software, tens of
times slower than fp32: the CPU defaults keep a low-precision regime only where this CPU runs
its dtype natively. The flags decide when they say native; otherwise the ratio time(dtype) /
time(fp32) of one matmul on one thread, cached per CPU model, torch version and dtype in
$XDG_CACHE_HOME/lmperf/lowp.json (docs/concepts.md, "CPU defaults that fit the CPU").
"""

from __future__ import annotations

import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from lmperf.runtime import device as dev
from lmperf.runtime.cache import read_cache, update_cache

CPUINFO = Path("/proc/cpuinfo")
# architecture -> dtype -> the CPU flags (as /proc/cpuinfo spells them) that give that dtype
# native matmuls: x86 AVX512-BF16 / AMX-BF16 (Cooper Lake, Sapphire Rapids, Zen 4 on) and
# AVX512-FP16 / AMX-FP16; Armv8.6 BF16 and the half-precision SIMD extension.
NATIVE_FLAGS: dict[str, dict[str, tuple[str, ...]]] = {
    "x86": {"bf16": ("avx512_bf16", "amx_bf16"), "fp16": ("avx512_fp16", "amx_fp16")},
    "arm": {"bf16": ("bf16",), "fp16": ("asimdhp",)},
}
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16,
                                  "fp16": torch.float16}
# A dtype whose matmul takes more than this many times fp32's is left out of CPU defaults:
# native bf16 runs at 0.3-1x fp32's time, software conversion at 5-245x (measured on this VM
# at 128..512, loaded and not), so the threshold sits far from both.
SLOW_RATIO = 2.0
MATMUL_N = 256  # (256, 256) @ (256, 256): 34 MFLOP, ~0.4 ms in fp32 on one thread here
REPEATS = 5
CACHE = "lowp.json"  # in $XDG_CACHE_HOME/lmperf


def cpu_flags(path: Path | None = None) -> frozenset[str] | None:
    """The CPU's feature flags (x86 'flags', Arm 'Features' line of `path`, default
    /proc/cpuinfo), or None where they cannot be read (no /proc: macOS, Windows)."""
    try:
        text = Path(path or CPUINFO).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return None


def architecture() -> str:
    """'arm' on Arm CPUs, else 'x86' (the flag names NATIVE_FLAGS looks for)."""
    return "arm" if platform.machine().lower() in ("aarch64", "arm64") else "x86"


def native_flags(dtype: str, flags: frozenset[str] | None) -> tuple[str, ...] | None:
    """The flags of `flags` that make `dtype` ('bf16' or 'fp16') native on this architecture
    (empty: none), or None when the flags are unknown."""
    if flags is None:
        return None
    return tuple(f for f in NATIVE_FLAGS[architecture()][dtype] if f in flags)


def _cpu_seconds(a: torch.Tensor, b: torch.Tensor) -> float:
    start = time.perf_counter()
    torch.mm(a, b)
    return time.perf_counter() - start


def measure_ratio(dtype: str, device: torch.device | None = None, n: int = MATMUL_N,
                  repeats: int = REPEATS) -> float:
    """time(`dtype` matmul) / time(fp32 matmul) of (n, n) @ (n, n) on `device` (default: the
    CPU, on one thread: the thread policy of every lmperf command; CUDA: events around each
    call, L2 flushed, via the device layer). Medians of `repeats` calls, fp32 and `dtype`
    alternated so that both see the same load, after one untimed call of each."""
    device = device or torch.device("cpu")
    gen = torch.Generator().manual_seed(0)
    a32, b32 = (torch.randn(n, n, generator=gen).to(device) for _ in range(2))
    pairs = {"fp32": (a32, b32), dtype: (a32.to(DTYPES[dtype]), b32.to(DTYPES[dtype]))}
    times: dict[str, list[float]] = {name: [] for name in pairs}
    if device.type == "cuda":
        for name, (a, b) in pairs.items():
            times[name] = dev.time_cuda_calls(lambda: torch.mm(a, b), device, 1, repeats)
    else:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for i in range(repeats + 1):  # round 0 warms up (allocator, kernel choice)
                for name, (a, b) in pairs.items():
                    seconds = _cpu_seconds(a, b)
                    if i:
                        times[name].append(seconds)
        finally:
            torch.set_num_threads(threads)
    return statistics.median(times[dtype]) / statistics.median(times["fp32"])


def _cache_key(dtype: str) -> str:
    return f"{dev.cpu_model()} | torch {torch.__version__} | {dtype} | {MATMUL_N}"


def store_ratios(ratios: dict[str, float]) -> None:
    """Keep this CPU's measured ratios (dtype -> time / fp32's, at MATMUL_N) in the cache; a
    cache that cannot be written only costs the next command another measurement."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    update_cache(CACHE, {_cache_key(d): {"ratio": r, "when": when} for d, r in ratios.items()})


def cpu_ratio(dtype: str) -> tuple[float, str]:
    """(time(dtype) / time(fp32) of the reference matmul on this CPU, and where it comes from:
    'measured now', or 'measured <UTC time>' from the cache)."""
    entry = read_cache(CACHE).get(_cache_key(dtype))
    if isinstance(entry, dict) and isinstance(entry.get("ratio"), (int, float)) \
            and entry["ratio"] > 0:
        return float(entry["ratio"]), f"measured {entry.get('when', 'earlier')}"
    ratio = measure_ratio(dtype)
    store_ratios({dtype: ratio})
    return ratio, "measured now"


@dataclass(frozen=True)
class Support:
    """What this CPU does with one low-precision dtype.

    dtype: 'bf16' or 'fp16'. flags: the native flags it has (empty: none; None: unknown).
    ratio: measured time(dtype) / time(fp32) of the reference matmul, None when not measured
    (the flags said native). source: where `ratio` comes from.
    """

    dtype: str
    flags: tuple[str, ...] | None
    ratio: float | None = None
    source: str = ""

    @property
    def slow(self) -> bool:
        """Whether the dtype's matmuls are too slow here for a default (see SLOW_RATIO)."""
        return not self.flags and self.ratio is not None and self.ratio > SLOW_RATIO

    def why(self) -> str:
        """Why a default leaves the dtype out: 'no native bf16 (no avx512_bf16/amx_bf16 flag);
        bf16 matmuls run 66x slower than fp32 here (256x256, measured now)'."""
        wanted = "/".join(NATIVE_FLAGS[architecture()][self.dtype])
        has = (f"no native {self.dtype} (no {wanted} flag)" if self.flags is not None
               else f"no flag saying native {self.dtype}")
        ratio = self.ratio or float("nan")
        times = f"{ratio:.1f}" if ratio < 10 else f"{ratio:.0f}"
        return (f"{has}; {self.dtype} matmuls run {times}x slower than fp32 here "
                f"({MATMUL_N}x{MATMUL_N}, {self.source})")


def cpu_support(dtype: str) -> Support:
    """This CPU's Support of `dtype` ('bf16' or 'fp16'): native flags first; the measured
    (cached) ratio where the flags do not say native."""
    flags = native_flags(dtype, cpu_flags())
    if flags:
        return Support(dtype, flags)
    ratio, source = cpu_ratio(dtype)
    return Support(dtype, flags, ratio, source)
