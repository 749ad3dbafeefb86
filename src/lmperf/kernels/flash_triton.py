"""FlashAttention-2 as Triton kernels: tiled forward and backward behind an autograd Function.

Algorithm (Dao, 2023), per (batch, head) slice with queries Q (Nq, d) and keys/values K, V (Nk, d):

- Forward: one program per (query tile, batch*head). It keeps its Q tile and three fp32 accumulators
  (o_acc (BLOCK_Q, d), row max m, row sum l) and walks the key tiles in a single loop with the
  online softmax: m' = max(m, rowmax(S)), l = l * exp(m - m') + rowsum(exp(S - m')),
  o_acc = o_acc * exp(m - m') + exp(S - m') V. It writes O = o_acc / l and the row logsumexp
  L = m + log(l) (fp32); the (Nq, Nk) score matrix never exists in memory. Exponentials are taken
  in base 2 (scores pre-multiplied by log2(e)); L is stored in natural-log units.
- Causal (top-left aligned, as `F.scaled_dot_product_attention(is_causal=True)`: query i sees keys
  0..i): key tiles entirely above the diagonal are never visited, since the loop bound is
  min(Nk, (query_tile + 1) * BLOCK_Q); only tiles that cross the diagonal apply the causal mask.
- Backward: D = rowsum(dO * O) (fp32, a small kernel), then two kernels that recompute
  P = exp(Q K^T * scale - L) tile by tile, so nothing of size (Nq, Nk) is stored either:
  one program per key tile accumulates dV = P^T dO and dK = scale * dS^T Q with
  dS = P * (dO V^T - D), and one program per query tile accumulates dQ = scale * dS K.
  Two kernels instead of one with atomics: every gradient tile has exactly one writer.

Ragged sequence lengths (not multiples of the tiles) and head dims that are not a power of two are
handled by masked loads and stores: the head dim is padded to BLOCK_D = next power of two >= 16
inside the kernel (zeros contribute nothing to Q K^T or P V); d above 128 is refused: the CUDA
launch table below (GPU_CONFIGS: tiles, warps and pipeline stages per kernel, dtype and d) was
checked for shared memory and register spills up to d = 128 only.

Where it runs: on CUDA, compiled by Triton; on the CPU only through Triton's interpreter
(TRITON_INTERPRET=1 in the environment), which executes the same kernel source with numpy and is
what the CPU tests use. One interpreter-only detail: Triton 3.9's interpreter multiplies bf16
`tl.dot` operands as their raw uint16 bit patterns, so there (and only there) bf16 operands are
widened to fp32 just before each dot. bf16 x bf16 products are exact in fp32, so this gives what
the GPU's bf16 tensor cores with fp32 accumulation give, up to summation order.

fp32 inputs use IEEE fp32 dots (`input_precision="ieee"`), not TF32: fp32 here means fp32.

Triton is imported lazily (this module imports without it), and the kernels are `triton.jit`-ed on
first use, with the device functions they call, so that TRITON_INTERPRET is read when a kernel is
first launched, not at import time.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from typing import Any

import torch

from lmperf.errors import SpecError

try:  # Triton is optional: the registry reports its absence as a clean error.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is not installed
    triton = None
    tl = None

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_HEAD_DIM = 128
MIN_BLOCK = 16  # tl.dot needs every dimension >= 16
INTERPRETER_BLOCKS = (32, 16)
"""(BLOCK_Q, BLOCK_K) in the interpreter: small tiles keep it fast and, being unequal, exercise the
causal loop bound with a query tile spanning several key tiles."""
WHERE_MSG = ("flash-triton runs on CUDA, or on the CPU through Triton's interpreter "
             "(TRITON_INTERPRET=1)")


def triton_available() -> bool:
    """Whether Triton can be imported in this environment."""
    return triton is not None


def interpreter_enabled() -> bool:
    """Whether TRITON_INTERPRET is set to a true value now (read as Triton reads it)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


def unsupported_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why flash-triton cannot run on (`device`, `dtype`) here, or None when it can."""
    if triton is None:
        return "flash-triton needs Triton, which is not installed (pip install triton)"
    if dtype not in SUPPORTED_DTYPES:
        return f"flash-triton supports float32, bfloat16 and float16, not {dtype}"
    if device.type == "cuda" or (device.type == "cpu" and interpreter_enabled()):
        return None
    return f"{WHERE_MSG}; got a {device.type} tensor" + (
        " and TRITON_INTERPRET is not set" if device.type == "cpu" else ""
    )


# --- kernels (plain functions, jitted on first use) ----------------------------------------------
# Every tensor is contiguous (batch*heads, seq, d), so a row is `head_dim` elements apart and a
# (batch*head) slice `seq * head_dim` apart. Row / column vectors are written `[:, None]` /
# `[None, :]`; shapes are given as (rows, cols) in tiles.

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

if tl is not None:
    # Globals read inside a jitted kernel must be constexpr.
    _LOG2E = tl.constexpr(LOG2E)
    _LN2 = tl.constexpr(LN2)

    def _fwd_kernel(Q, K, V, O, L, ITERS, n_q, n_k, head_dim, qk_scale_log2,
                    IS_CAUSAL: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                    BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr,
                    RECORD_ITERS: tl.constexpr):
        pid_q = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)
        offs_q = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
        offs_d = tl.arange(0, BLOCK_D)
        q_ok = offs_q < n_q
        d_ok = offs_d < head_dim
        q_base = Q + bh * n_q * head_dim
        k_base = K + bh * n_k * head_dim
        v_base = V + bh * n_k * head_dim

        q = tl.load(q_base + offs_q[:, None] * head_dim + offs_d[None, :],
                    mask=q_ok[:, None] & d_ok[None, :], other=0.0)  # (BQ, BD)
        if UPCAST_DOT:
            q = q.to(tl.float32)
        m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)  # running row max, log2 units
        l_i = tl.zeros([BLOCK_Q], tl.float32)  # running row sum of exp2(s - m_i)
        acc = tl.zeros([BLOCK_Q, BLOCK_D], tl.float32)  # unnormalised output

        # Causal: the last key this tile's last query sees is (pid_q + 1) * BLOCK_Q - 1, so key
        # tiles from there on are all above the diagonal and are skipped by the bound itself.
        if IS_CAUSAL:
            hi = tl.minimum(n_k, (pid_q + 1) * BLOCK_Q)
        else:
            hi = n_k
        n_iters = 0
        for start_k in range(0, hi, BLOCK_K):
            offs_k = start_k + tl.arange(0, BLOCK_K)
            k_ok = offs_k < n_k
            kv_mask = k_ok[:, None] & d_ok[None, :]
            kv_offs = offs_k[:, None] * head_dim + offs_d[None, :]
            k = tl.load(k_base + kv_offs, mask=kv_mask, other=0.0)  # (BK, BD)
            v = tl.load(v_base + kv_offs, mask=kv_mask, other=0.0)
            if UPCAST_DOT:
                k = k.to(tl.float32)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale_log2  # (BQ, BK)
            s = tl.where(k_ok[None, :], s, float("-inf"))  # ragged last key tile
            if IS_CAUSAL:
                if start_k + BLOCK_K - 1 > pid_q * BLOCK_Q:  # the tile crosses the diagonal
                    s = tl.where(offs_k[None, :] <= offs_q[:, None], s, float("-inf"))
            # Every row sees key 0 in the first tile, so m_new is finite from then on and a
            # fully masked row within a later tile only adds exp2(-inf) = 0.
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)  # rescales what was accumulated under the old max
            p = tl.exp2(s - m_new[:, None])  # (BQ, BK)
            l_i = l_i * alpha + tl.sum(p, 1)
            p = p.to(V.dtype.element_ty)  # P V in the input precision, fp32 accumulation
            if UPCAST_DOT:
                p = p.to(tl.float32)
                v = v.to(tl.float32)
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
            m_i = m_new
            n_iters += 1

        acc = acc / l_i[:, None]
        o_base = O + bh * n_q * head_dim
        tl.store(o_base + offs_q[:, None] * head_dim + offs_d[None, :],
                 acc.to(O.dtype.element_ty), mask=q_ok[:, None] & d_ok[None, :])
        tl.store(L + bh * n_q + offs_q, (m_i + tl.log2(l_i)) * _LN2, mask=q_ok)
        if RECORD_ITERS:  # test hook: how many key tiles this program visited
            tl.store(ITERS + bh * tl.num_programs(0) + pid_q, n_iters)

    def _bwd_delta_kernel(O, DO, DELTA, n_rows, head_dim,
                          BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
        # D = rowsum(dO * O) over rows of the flattened (batch*heads*n_q, d) tensors.
        offs_r = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        offs_d = tl.arange(0, BLOCK_D)
        mask = (offs_r < n_rows)[:, None] & (offs_d < head_dim)[None, :]
        ptrs = offs_r[:, None] * head_dim + offs_d[None, :]
        o = tl.load(O + ptrs, mask=mask, other=0.0).to(tl.float32)
        do = tl.load(DO + ptrs, mask=mask, other=0.0).to(tl.float32)
        tl.store(DELTA + offs_r, tl.sum(o * do, 1), mask=offs_r < n_rows)

    # --- device functions of the backward kernels (jitted with them by `_kernels`; Triton inlines
    # them, so the compiled kernels are as if written out in place) --------------------------------

    def _row_tile(start, n_rows, base, head_dim, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
        """Rows start..start+BLOCK-1 of a row-major (n_rows, head_dim) slice that begins `base`
        elements into its tensor, padded to BLOCK_D columns: the row offsets (BLOCK,), the rows
        in range (BLOCK,), the element offsets (BLOCK, BLOCK_D) and the elements in range."""
        offs = start + tl.arange(0, BLOCK)
        offs_d = tl.arange(0, BLOCK_D)
        ok = offs < n_rows
        mask = ok[:, None] & (offs_d < head_dim)[None, :]
        ptrs = base + offs[:, None] * head_dim + offs_d[None, :]
        return offs, ok, ptrs, mask

    def _load_pair(X, Y, ptrs, mask, UPCAST_DOT: tl.constexpr):
        """The same tile of two tensors laid out alike (K and V, or Q and dO), zero out of range;
        widened to fp32 where the interpreter needs it for tl.dot (module docstring)."""
        x = tl.load(X + ptrs, mask=mask, other=0.0)
        y = tl.load(Y + ptrs, mask=mask, other=0.0)
        if UPCAST_DOT:
            x = x.to(tl.float32)
            y = y.to(tl.float32)
        return x, y

    def _dot_operand(x, DTYPE: tl.constexpr, UPCAST_DOT: tl.constexpr):
        """x (fp32) rounded to the inputs' dtype DTYPE for a dot in the input precision (fp32
        accumulation), widened back to fp32 only in the interpreter."""
        x = x.to(DTYPE)
        if UPCAST_DOT:
            x = x.to(tl.float32)
        return x

    def _recompute_p(q, k, lse, offs_q, q_ok, offs_k, k_ok, sm_scale, IS_CAUSAL: tl.constexpr,
                     DOT_PRECISION: tl.constexpr):
        """P = exp(Q K^T * scale - L) (BQ, BK) fp32 for a query tile q (BQ, BD) with its row
        logsumexp lse (BQ,) and a key tile k (BK, BD): the forward's softmax probabilities,
        zero for keys or queries out of range and, if causal, keys after the query."""
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (BQ, BK)
        p = tl.exp2((s * sm_scale - lse[:, None]) * _LOG2E)
        keep = q_ok[:, None] & k_ok[None, :]
        if IS_CAUSAL:
            keep = keep & (offs_k[None, :] <= offs_q[:, None])
        return tl.where(keep, p, 0.0)

    def _score_grad(p, do, v, delta, DOT_PRECISION: tl.constexpr):
        """dS = P * (dO V^T - D) (BQ, BK) fp32 from P (BQ, BK), the dO tile (BQ, BD), the V tile
        (BK, BD) and D = rowsum(dO * O) (BQ,)."""
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)  # (BQ, BK)
        return p * (dp - delta[:, None])

    def _bwd_dkdv_kernel(Q, K, V, DO, L, DELTA, DK, DV, n_q, n_k, head_dim, sm_scale,
                         IS_CAUSAL: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                         BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
                         UPCAST_DOT: tl.constexpr):
        pid_k = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)
        offs_k, k_ok, kv_offs, kv_mask = _row_tile(pid_k * BLOCK_K, n_k, bh * n_k * head_dim,
                                                   head_dim, BLOCK_K, BLOCK_D)
        k, v = _load_pair(K, V, kv_offs, kv_mask, UPCAST_DOT)  # (BK, BD)
        dk = tl.zeros([BLOCK_K, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_K, BLOCK_D], tl.float32)
        q_base = Q + bh * n_q * head_dim
        do_base = DO + bh * n_q * head_dim

        # Causal: queries before this tile's first key see none of its keys, so the query loop
        # starts at query pid_k * BLOCK_K (its tiles need not align with the forward's).
        if IS_CAUSAL:
            lo = pid_k * BLOCK_K
        else:
            lo = 0
        for start_q in range(lo, n_q, BLOCK_Q):
            offs_q, q_ok, q_offs, q_mask = _row_tile(start_q, n_q, 0, head_dim, BLOCK_Q, BLOCK_D)
            q, do = _load_pair(q_base, do_base, q_offs, q_mask, UPCAST_DOT)  # (BQ, BD)
            lse = tl.load(L + bh * n_q + offs_q, mask=q_ok, other=0.0)  # (BQ,)
            delta = tl.load(DELTA + bh * n_q + offs_q, mask=q_ok, other=0.0)
            p = _recompute_p(q, k, lse, offs_q, q_ok, offs_k, k_ok, sm_scale, IS_CAUSAL,
                             DOT_PRECISION)  # (BQ, BK)
            p_lo = _dot_operand(p, DO.dtype.element_ty, UPCAST_DOT)
            dv += tl.dot(tl.trans(p_lo), do, input_precision=DOT_PRECISION)  # (BK, BD)
            ds = _dot_operand(_score_grad(p, do, v, delta, DOT_PRECISION), Q.dtype.element_ty,
                              UPCAST_DOT)
            dk += tl.dot(tl.trans(ds), q, input_precision=DOT_PRECISION)  # (BK, BD)

        tl.store(DK + kv_offs, (dk * sm_scale).to(DK.dtype.element_ty), mask=kv_mask)
        tl.store(DV + kv_offs, dv.to(DV.dtype.element_ty), mask=kv_mask)

    def _bwd_dq_kernel(Q, K, V, DO, L, DELTA, DQ, n_q, n_k, head_dim, sm_scale,
                       IS_CAUSAL: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                       BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
                       UPCAST_DOT: tl.constexpr):
        pid_q = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)
        offs_q, q_ok, q_offs, q_mask = _row_tile(pid_q * BLOCK_Q, n_q, bh * n_q * head_dim,
                                                 head_dim, BLOCK_Q, BLOCK_D)
        q, do = _load_pair(Q, DO, q_offs, q_mask, UPCAST_DOT)  # (BQ, BD)
        lse = tl.load(L + bh * n_q + offs_q, mask=q_ok, other=0.0)  # (BQ,)
        delta = tl.load(DELTA + bh * n_q + offs_q, mask=q_ok, other=0.0)
        dq = tl.zeros([BLOCK_Q, BLOCK_D], tl.float32)
        k_base = K + bh * n_k * head_dim
        v_base = V + bh * n_k * head_dim

        if IS_CAUSAL:  # same bound as the forward
            hi = tl.minimum(n_k, (pid_q + 1) * BLOCK_Q)
        else:
            hi = n_k
        for start_k in range(0, hi, BLOCK_K):
            offs_k, k_ok, kv_offs, kv_mask = _row_tile(start_k, n_k, 0, head_dim, BLOCK_K, BLOCK_D)
            k, v = _load_pair(k_base, v_base, kv_offs, kv_mask, UPCAST_DOT)  # (BK, BD)
            p = _recompute_p(q, k, lse, offs_q, q_ok, offs_k, k_ok, sm_scale, IS_CAUSAL,
                             DOT_PRECISION)  # (BQ, BK)
            ds = _dot_operand(_score_grad(p, do, v, delta, DOT_PRECISION), K.dtype.element_ty,
                              UPCAST_DOT)
            dq += tl.dot(ds, k, input_precision=DOT_PRECISION)  # (BQ, BD)

        tl.store(DQ + q_offs, (dq * sm_scale).to(DQ.dtype.element_ty), mask=q_mask)

    _DEVICE_FUNCTIONS = (_row_tile, _load_pair, _dot_operand, _recompute_p, _score_grad)


@functools.cache
def _kernels(interpret: bool) -> dict[str, Any]:
    """The kernels, jitted for the compiler or for the interpreter (Triton decides at jit time),
    after their device functions (bound under their own names)."""
    del interpret  # only the cache key: triton.jit reads TRITON_INTERPRET itself
    # The kernels call their device functions by global name, and Triton looks those names up in
    # this module when it compiles or interprets a kernel: the names must hold the functions
    # jitted in the kernels' own mode (a kernel cannot call a plain Python function).
    for fn in _DEVICE_FUNCTIONS:
        globals()[fn.__name__] = triton.jit(fn)
    return {
        "fwd": triton.jit(_fwd_kernel),
        "delta": triton.jit(_bwd_delta_kernel),
        "dkdv": triton.jit(_bwd_dkdv_kernel),
        "dq": triton.jit(_bwd_dq_kernel),
    }


# --- launch configuration -------------------------------------------------------------------------

@dataclass(frozen=True)
class TileConfig:
    """One kernel's launch choice on CUDA: its tiles and Triton's compile options."""

    block_q: int  # queries per tile (BLOCK_Q)
    block_k: int  # keys per tile (BLOCK_K)
    num_warps: int
    num_stages: int  # software-pipelining depth of the loop's loads


KERNELS = ("fwd", "dkdv", "dq")
"""The kernels whose tiles are chosen per (dtype, d); `delta` has no loop and one fixed shape."""
DELTA_CONFIG = TileConfig(block_q=64, block_k=0, num_warps=4, num_stages=1)
"""The delta kernel: 64 rows per program (block_q), no key tiles, nothing to pipeline."""

# Chosen by compiling for sm_80 and sm_90 without a GPU (`python -m tests.kernels.triton_report`,
# checked by tests/kernels/test_triton_compile.py): the largest tiles that compile with no
# local-memory stack frame (no register spill) on both targets, causal or not, keeping the earlier
# 64 x 64 tiles wherever they already did. Not timed on a GPU: speed may favour other tiles.
# - fp32 (IEEE dots, no tensor cores: Triton lowers them to FMAs with the operand tiles in
#   registers): with 2 pipeline stages every tile size tried spilled (dkdv, d = 64, sm_80: from
#   64 x 64 down to 16 x 16), so fp32 runs 1 stage, 8 warps, and tiles shrink as d grows; dK/dV
#   holds two (BLOCK_K, d) fp32 accumulators plus K and V, hence the smallest tiles.
# - bf16 / fp16 (tensor cores): the 64 x 64 tiles fit, except dK/dV on sm_80, which spilled
#   (d = 64: 8 warps instead of 4 fix it; d = 128, already at 8 warps: 32 query rows per step
#   instead of 64), and the d = 128 forward on sm_80, which spilled at 2 stages (3 fix it).
_F32, _B16, _F16 = torch.float32, torch.bfloat16, torch.float16
_CHOICES = {  # (kernel, head dim bucket) -> (fp32 config, 16-bit config)
    ("fwd", 64): (TileConfig(64, 32, 8, 1), TileConfig(64, 64, 4, 2)),
    ("fwd", 128): (TileConfig(32, 64, 8, 1), TileConfig(64, 64, 8, 3)),
    ("dkdv", 64): (TileConfig(32, 32, 8, 1), TileConfig(64, 64, 8, 2)),
    ("dkdv", 128): (TileConfig(16, 32, 8, 1), TileConfig(32, 64, 8, 2)),
    ("dq", 64): (TileConfig(64, 32, 8, 1), TileConfig(64, 64, 4, 2)),
    ("dq", 128): (TileConfig(32, 64, 8, 1), TileConfig(64, 64, 8, 2)),
}
GPU_CONFIGS: dict[tuple[str, torch.dtype, int], TileConfig] = {
    (kernel, dtype, d): pair[0] if dtype == _F32 else pair[1]
    for (kernel, d), pair in _CHOICES.items() for dtype in (_F32, _B16, _F16)
}
"""(kernel, dtype, d bucket: 64 for d <= 64, else 128) -> the kernel's launch on CUDA."""


def gpu_config(kernel: str, dtype: torch.dtype, head_dim: int) -> TileConfig:
    """The launch configuration of `kernel` ("fwd", "dkdv", "dq" or "delta") on CUDA for inputs
    of `dtype` and head dim `head_dim` (<= 128): the GPU_CONFIGS entry for d <= 64 or d <= 128."""
    if kernel == "delta":
        return DELTA_CONFIG
    return GPU_CONFIGS[kernel, dtype, 64 if head_dim <= 64 else 128]


def _interpreting(q: torch.Tensor) -> bool:
    """Whether q's kernels run in Triton's interpreter (any non-CUDA tensor, or the variable)."""
    return q.device.type != "cuda" or interpreter_enabled()


def launch_arguments(kernel: str, dtype: torch.dtype, head_dim: int, interpret: bool,
                     block_q: int | None = None, block_k: int | None = None,
                     tiles: TileConfig | None = None) -> dict[str, Any]:
    """`kernel`'s constexpr arguments and, unless `interpret`, its compile options (num_warps,
    num_stages), for inputs of `dtype` and head dim `head_dim`.

    The tiles are `block_q` / `block_k` where given, else `tiles`' (default: `gpu_config`'s on
    CUDA, INTERPRETER_BLOCKS in the interpreter). The launchers and the compile-only check
    (tests/kernels/triton_report.py) both build a launch here. Raises SpecError for a tile that
    is not a power of two >= 16.
    """
    tiles = tiles or (None if interpret else gpu_config(kernel, dtype, head_dim))
    # The interpreter takes no compile options.
    opts = {} if interpret else {"num_warps": tiles.num_warps, "num_stages": tiles.num_stages}
    block_d = max(MIN_BLOCK, 1 << (head_dim - 1).bit_length())  # next power of two >= 16
    if kernel == "delta":  # no loop, no tiles to choose: rows per program only
        return {"BLOCK_ROWS": DELTA_CONFIG.block_q, "BLOCK_D": block_d, **opts}
    bq = block_q or (tiles.block_q if tiles else INTERPRETER_BLOCKS[0])
    bk = block_k or (tiles.block_k if tiles else INTERPRETER_BLOCKS[1])
    for name, b in (("block_q", bq), ("block_k", bk)):
        if b < MIN_BLOCK or b & (b - 1):
            raise SpecError(f"flash-triton {name} must be a power of two >= {MIN_BLOCK}, got {b}")
    return {
        "BLOCK_Q": bq,
        "BLOCK_K": bk,
        "BLOCK_D": block_d,
        "DOT_PRECISION": "ieee" if dtype == torch.float32 else "tf32",  # ignored for 16-bit
        "UPCAST_DOT": interpret and dtype == torch.bfloat16,  # see the module docstring
        **opts,
    }


def _launch_config(q: torch.Tensor, kernel: str, block_q: int | None = None,
                   block_k: int | None = None) -> dict[str, Any]:
    """`launch_arguments` for q's device, dtype and head dim."""
    return launch_arguments(kernel, q.dtype, q.shape[-1], _interpreting(q), block_q, block_k)


def flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                  block_q: int | None = None, block_k: int | None = None,
                  record_iters: bool = False,
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Forward on contiguous (BH, Nq, d) q and (BH, Nk, d) k, v.

    Returns (o (BH, Nq, d) in q's dtype, L (BH, Nq) fp32 row logsumexp in natural-log units,
    iters (BH, n_query_tiles) int32 key tiles visited per program, or None unless `record_iters`).
    """
    cfg = _launch_config(q, "fwd", block_q, block_k)
    bh, n_q, d = q.shape
    n_k = k.shape[1]
    o = torch.empty_like(q)
    lse = torch.empty(bh, n_q, device=q.device, dtype=torch.float32)
    n_tiles = triton.cdiv(n_q, cfg["BLOCK_Q"])
    iters = torch.zeros(bh, n_tiles, device=q.device, dtype=torch.int32) if record_iters else lse
    _kernels(_interpreting(q))["fwd"][(n_tiles, bh)](
        q, k, v, o, lse, iters, n_q, n_k, d, LOG2E / math.sqrt(d),
        IS_CAUSAL=is_causal, RECORD_ITERS=record_iters, **cfg)
    return o, lse, (iters if record_iters else None)


def flash_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                   lse: torch.Tensor, do: torch.Tensor, is_causal: bool,
                   block_q: int | None = None, block_k: int | None = None,
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward on contiguous (BH, N, d) tensors and L (BH, Nq) fp32: returns (dq, dk, dv),
    each in its input's dtype and shape, recomputing P from L tile by tile."""
    bh, n_q, d = q.shape
    n_k = k.shape[1]
    kernels = _kernels(_interpreting(q))
    scale = 1.0 / math.sqrt(d)

    delta = torch.empty(bh, n_q, device=q.device, dtype=torch.float32)  # D = rowsum(dO * O)
    cfg = _launch_config(q, "delta")
    kernels["delta"][(triton.cdiv(bh * n_q, cfg["BLOCK_ROWS"]),)](
        o, do, delta, bh * n_q, d, **cfg)

    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    cfg = _launch_config(q, "dkdv", block_q, block_k)  # one program per key tile
    kernels["dkdv"][(triton.cdiv(n_k, cfg["BLOCK_K"]), bh)](
        q, k, v, do, lse, delta, dk, dv, n_q, n_k, d, scale, IS_CAUSAL=is_causal, **cfg)
    cfg = _launch_config(q, "dq", block_q, block_k)  # one program per query tile
    kernels["dq"][(triton.cdiv(n_q, cfg["BLOCK_Q"]), bh)](
        q, k, v, do, lse, delta, dq, n_q, n_k, d, scale, IS_CAUSAL=is_causal, **cfg)
    return dq, dk, dv


# --- validation and the autograd Function ---------------------------------------------------------

def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise SpecError unless q, k, v are valid flash-triton inputs on a usable device."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise SpecError(f"flash-triton: {name} must be a tensor, got {type(t).__name__}")
    if q.dim() not in (3, 4) or k.dim() != q.dim() or v.dim() != q.dim():
        raise SpecError("flash-triton takes q, k, v shaped (batch, seq, d) or (batch, heads, seq, "
                        f"d), all of one rank; got {tuple(q.shape)}, {tuple(k.shape)}, "
                        f"{tuple(v.shape)}")
    if k.shape != v.shape or q.shape[:-2] != k.shape[:-2] or q.shape[-1] != k.shape[-1]:
        raise SpecError("flash-triton: q, k, v must share batch (and heads) and d, and k, v their "
                        f"shape; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise SpecError(f"flash-triton: q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype})")
    if q.device != k.device or q.device != v.device:
        raise SpecError(f"flash-triton: q, k, v are on different devices ({q.device}, {k.device}, "
                        f"{v.device})")
    if q.shape[-2] == 0 or k.shape[-2] == 0 or q.numel() == 0:
        raise SpecError(f"flash-triton: empty input {tuple(q.shape)}, {tuple(k.shape)}")
    if q.shape[-1] > MAX_HEAD_DIM:
        raise SpecError(f"flash-triton supports d <= {MAX_HEAD_DIM} (padded to a power of two "
                        f">= {MIN_BLOCK}), got d = {q.shape[-1]}")
    reason = unsupported_reason(q.device, q.dtype)
    if reason:
        raise SpecError(reason)


class FlashAttentionTriton(torch.autograd.Function):
    """FlashAttention-2 with Triton kernels; saves exactly q, k, v, o and L (batch[, heads], Nq).

    `FlashAttentionTriton.apply(q, k, v, is_causal)` is the course's call (`is_causal` may be
    left out: False); the tiles default per device, kernel, dtype and d. Inputs are checked here
    (SpecError).
    """

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                block_q: int | None = None, block_k: int | None = None) -> torch.Tensor:
        check_inputs(q, k, v)
        is_causal = bool(is_causal)
        # Flatten (B[, H]) into one grid axis; .contiguous() is free for contiguous inputs.
        lead, n_q, d = q.shape[:-2], q.shape[-2], q.shape[-1]
        q, k, v = (t.contiguous() for t in (q, k, v))
        o, lse, _ = flash_forward(q.view(-1, n_q, d), k.view(-1, k.shape[-2], d),
                                  v.view(-1, v.shape[-2], d), is_causal, block_q, block_k)
        o, lse = o.view(q.shape), lse.view(*lead, n_q)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal, ctx.blocks = is_causal, (block_q, block_k)
        return o

    @staticmethod
    def backward(ctx, do: torch.Tensor):
        q, k, v, o, lse = ctx.saved_tensors
        n_q, n_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
        dq, dk, dv = flash_backward(
            q.view(-1, n_q, d), k.view(-1, n_k, d), v.view(-1, n_k, d), o.view(-1, n_q, d),
            lse.view(-1, n_q), do.contiguous().view(-1, n_q, d), ctx.is_causal, *ctx.blocks)
        return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape), None, None, None


def flash_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           is_causal: bool = False, *, block_q: int | None = None,
                           block_k: int | None = None) -> torch.Tensor:
    """FlashAttention-2 (Triton) of q (..., Nq, d) over k, v (..., Nk, d); returns o like q.

    Inputs are (batch, seq, d) or (batch, heads, seq, d) in float32, bfloat16 or float16, on CUDA
    or (with TRITON_INTERPRET=1) on the CPU; d <= 128, padded inside the kernel to a power of two.
    Causal masking is top-left aligned (query i sees keys 0..i). `block_q` / `block_k` override
    the tile sizes (powers of two >= 16). Raises SpecError for anything else.
    """
    return FlashAttentionTriton.apply(q, k, v, bool(is_causal), block_q, block_k)
