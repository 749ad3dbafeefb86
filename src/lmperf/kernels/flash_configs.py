"""flash-triton's launch configurations on CUDA: fixed defaults, and a search that picks one per
kernel and key inside `searching()` (the attention and bench jobs' warm-up). Imports no Triton,
touches no device (the jobs import it in the fork server). docs/commands/attention.md.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import torch


@dataclass(frozen=True)
class TileConfig:
    """One kernel's launch: tiles (queries x keys), warps, software-pipelining stages."""

    block_q: int
    block_k: int
    num_warps: int
    num_stages: int

    def label(self) -> str:
        return f"{self.block_q}x{self.block_k} w{self.num_warps} s{self.num_stages}"


KERNELS = ("fwd", "dkdv", "dq")  # with a loop; `delta` runs DELTA_ROWS rows a program
DELTA_ROWS = 64
# (kernel, d <= 64 or <= 128) -> (fp32, 16-bit) defaults, without a spill on sm_80 and sm_90
# with Triton 3.9 and 3.6 (the fp32 dQ at d 64 aside: 16 bytes on sm_80 with 3.6; no tile tried
# was clean on both). dKdV 16-bit at d 64 was 64 x 64 w8: 254 registers on sm_80, 255 and a
# spill with Triton 3.6. fp32 (IEEE dots on FMA units) always takes them: the 16-bit space
# spills there.
_T = TileConfig
_DEFAULTS = {("fwd", 64): (_T(64, 32, 8, 1), _T(64, 64, 4, 2)),
             ("fwd", 128): (_T(32, 32, 8, 1), _T(64, 64, 8, 3)),
             ("dkdv", 64): (_T(16, 32, 8, 1), _T(32, 64, 8, 2)),
             ("dkdv", 128): (_T(16, 32, 8, 1), _T(32, 64, 8, 2)),
             ("dq", 64): (_T(64, 32, 8, 1), _T(64, 64, 4, 2)),
             ("dq", 128): (_T(32, 64, 8, 1), _T(64, 64, 8, 2))}


def default_config(kernel: str, dtype: torch.dtype, head_dim: int) -> TileConfig:
    """`kernel`'s launch for `dtype` and head dim <= 128 when no search chose one."""
    if kernel == "delta":
        return TileConfig(DELTA_ROWS, 0, 4, 1)
    return _DEFAULTS[kernel, 64 if head_dim <= 64 else 128][dtype != torch.float32]


# The 16-bit space (Triton tutorial 06's): a program's own tile (queries for fwd and dq, keys for
# dkdv) 64 or 128, the loop's step 32 to 128 but not above it, 4 or 8 warps, 2 to 4 stages.
SPACE = [(own, step, warps, stages) for own in (64, 128) for step in (32, 64, 128) if step <= own
         for warps in (4, 8) for stages in (2, 3, 4)]
MAX_VALUES_PER_THREAD = 128  # the register rule's budget, calibrated on sm_80 and sm_90 compiles


def candidates(kernel: str, dtype: torch.dtype, block_d: int,
               shared_limit: int) -> list[TileConfig]:
    """SPACE less what would not fit `shared_limit` bytes of shared memory or would spill, by
    estimates (docs/commands/attention.md); 8 warps only for tiles that 4 do not fit."""
    size, tiles, kept, warps = dtype.itemsize, 1 if kernel == "fwd" else 2, [], {}
    for own, step, w, stages in SPACE:
        # 32-bit values per thread: fp32 accumulators, fp32 score tiles (one also in `dtype`),
        # the loop's two input tiles; shared: `stages` copies of those, own tiles, a score tile
        values = ((2 if kernel == "dkdv" else 1) * own * block_d + (tiles + size / 4) * own * step
                  + 2 * step * block_d * size / 4) / (32 * w)
        shared = (stages * 2 * step * block_d + tiles * own * block_d + own * step) * size
        if (values <= MAX_VALUES_PER_THREAD and shared <= shared_limit
                and warps.setdefault((own, step), w) == w):  # SPACE lists 4 warps first
            kept.append(TileConfig(step, own, w, stages) if kernel == "dkdv"
                        else TileConfig(own, step, w, stages))
    return kept


CHOSEN: dict[tuple, TileConfig] = {}  # key -> the configuration its search chose (this process)
SEARCHES: list[dict] = []  # one row per search this process ran (docs/commands/attention.md)
_state: dict = {"searched": None}  # the keys searched in the open searching() block, else None


def search_key(kernel: str, rows: int, n_q: int, n_k: int, head_dim: int, dtype: torch.dtype,
               causal: bool) -> tuple:
    """The kernel; batch * heads, Nq and Nk each rounded up to a power of two (keys grow with
    log(context), not with every length); the exact d; the dtype; causality."""
    pow2 = [1 << max(n - 1, 0).bit_length() for n in (rows, n_q, n_k)]
    return (kernel, *pow2, head_dim, str(dtype).removeprefix("torch."), causal)


@contextlib.contextmanager
def searching() -> Iterator[list[dict]]:
    """Search every key first met inside the block; yields a list of its SEARCHES rows (on exit)."""
    found: list[dict] = []
    start, _state["searched"] = len(SEARCHES), set()
    try:
        yield found
    finally:
        _state["searched"] = None
        found.extend(SEARCHES[start:])


def choose(key: tuple, default: TileConfig, trial: Callable[[TileConfig], float],
           shortlist: Callable[[], list[TileConfig]]) -> TileConfig:
    """`key`'s configuration: the one its search chose; else, inside `searching()`, the fastest
    of `shortlist()` by `trial` (ms; inf: cannot launch) in two rounds, each tile shape and warp
    count at its fewest stages, then the winner's other stage counts; else `default`. A search
    where nothing launched caches nothing (`default` runs) and is not repeated in the block."""
    if key in CHOSEN or _state["searched"] is None or key in _state["searched"]:
        return CHOSEN.get(key, default)
    _state["searched"].add(key)
    start, kept, first = time.perf_counter(), shortlist() or [default], {}
    for cfg in kept:
        first.setdefault(cfg.label()[:-3], cfg)  # label less " s<stages>": tiles and warps
    times = {cfg: trial(cfg) for cfg in first.values()}
    best = min(times, key=times.__getitem__)
    times.update({c: trial(c) for c in kept if c not in times and first[c.label()[:-3]] is best})
    best = min(times, key=times.__getitem__)
    if times[best] < math.inf:
        CHOSEN[key] = best
    SEARCHES.append({"kernel": key[0], "key": dict(zip(
        ("rows", "n_q", "n_k", "d", "dtype", "causal"), key[1:])),
        "chosen": best.label() if key in CHOSEN else None,  # None: none launched, the default ran
        "candidates_ms": {c.label(): round(t, 5) if t < math.inf else None  # None: no launch
                          for c, t in times.items()},
        "search_s": round(time.perf_counter() - start, 3)})
    return CHOSEN.get(key, default)
