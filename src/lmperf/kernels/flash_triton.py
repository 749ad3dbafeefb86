"""FlashAttention-2 (Dao, 2023) as Triton kernels behind an autograd Function: the forward (online
softmax over key tiles; writes O and the row logsumexp L), then D = rowsum(dO * O), dQ (a program
per query tile) and dK/dV (per key tile), recomputing P from L; one writer per output tile.
Causal (top-left, as SDPA's): off-diagonal tiles run unmasked, diagonal ones masked, tiles above
it never; heaviest programs first. Tensors are read through their strides; outputs are allocated
like their inputs. Tiles: `flash_configs`. Ragged lengths and d <= 128 are masked loads (d padded
to BLOCK_D). CUDA compiles; the CPU runs Triton's interpreter (TRITON_INTERPRET=1, one small
config), where bf16 dot operands are widened to fp32 (Triton 3.9's interpreter multiplies bf16 as
raw bits; bf16 products are exact in fp32). fp32 uses IEEE dots, not TF32. Kernels are jitted on
first use (TRITON_INTERPRET read then). Derivations: docs/commands/attention.md.
"""

from __future__ import annotations

import functools
import math
import statistics
from typing import Any, Callable

import torch

from lmperf.errors import SpecError
from lmperf.kernels import flash_configs as fc
from lmperf.kernels.flash_configs import KERNELS, TileConfig  # noqa: F401 (re-exported)
from lmperf.runtime import device as dev

try:  # Triton is optional: the registry reports its absence as a clean error.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is not installed
    triton = None
    tl = None

MAX_HEAD_DIM = 128
MIN_BLOCK = 16  # tl.dot needs every dimension >= 16
INTERPRETER_BLOCKS = (32, 16)  # (BLOCK_Q, BLOCK_K) there: small, and unequal for the causal bounds


def triton_available() -> bool:
    """Whether Triton can be imported in this environment."""
    return triton is not None


# --- kernels (plain functions, jitted on first use) ----------------------------------------------
# Grid (tiles, heads, batch). Slice (b, h) of X starts at X + b * s_b + h * s_h, rows s_t apart
# (`s*` arguments: q's, shared by O and dQ; k's by dK; v's by dV; dO's); L and D are contiguous
# (B, H, Nq). Row / column vectors are `[:, None]` / `[None, :]`.

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

if tl is not None:
    # Globals read inside a jitted kernel must be constexpr.
    _LOG2E = tl.constexpr(LOG2E)
    _LN2 = tl.constexpr(LN2)

    def _row_tile(start, n_rows, stride, stride2, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr,
                  BLOCK_D: tl.constexpr):
        # Rows start.. of two (n_rows, HEAD_DIM) slices, rows `stride` / `stride2` apart: offsets,
        # rows in range, each slice's element offsets, the mask (BLOCK, BLOCK_D) (d padded).
        offs, offs_d = start + tl.arange(0, BLOCK), tl.arange(0, BLOCK_D)
        ok = offs < n_rows
        mask = ok[:, None] & (offs_d < HEAD_DIM)[None, :]
        return (offs, ok, offs[:, None] * stride + offs_d[None, :],
                offs[:, None] * stride2 + offs_d[None, :], mask)

    def _operand(x, DTYPE: tl.constexpr, UPCAST_DOT: tl.constexpr):
        # x as a dot operand in DTYPE (fp32 accumulation), widened to fp32 in the interpreter.
        x = x.to(DTYPE)
        if UPCAST_DOT:
            x = x.to(tl.float32)
        return x

    def _load(ptrs, mask, UPCAST_DOT: tl.constexpr):
        # A tile as a dot operand, zero out of range.
        return _operand(tl.load(ptrs, mask=mask, other=0.0), ptrs.dtype.element_ty, UPCAST_DOT)

    def _fwd_steps(acc, m_i, l_i, n_iters, q, k_base, v_base, skt, svt, offs_q, lo, hi, n_k,
                   qk_scale_log2, MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr,
                   HEAD_DIM: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
                   DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr):
        # The online softmax over key tiles lo..hi; MASKED: keys past n_k, or after the query.
        for start_k in range(lo, hi, BLOCK_K):
            offs_k, k_ok, k_offs, v_offs, kv_mask = _row_tile(start_k, n_k, skt, svt, HEAD_DIM,
                                                              BLOCK_K, BLOCK_D)
            k = _load(k_base + k_offs, kv_mask, UPCAST_DOT)  # (BK, BD)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale_log2  # (BQ, BK)
            if MASKED:
                keep = k_ok[None, :]
                if IS_CAUSAL:
                    keep = keep & (offs_k[None, :] <= offs_q[:, None])
                s = tl.where(keep, s, float("-inf"))
            # Every row sees key 0 in its first tile, so m_new is finite from then on and a fully
            # masked row within a later tile only adds exp2(-inf) = 0.
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)  # rescales what was accumulated under the old max
            p = tl.exp2(s - m_new[:, None])  # (BQ, BK)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = _load(v_base + v_offs, kv_mask, UPCAST_DOT)
            acc = tl.dot(_operand(p, v_base.dtype.element_ty, UPCAST_DOT), v, acc * alpha[:, None],
                         input_precision=DOT_PRECISION)
            m_i = m_new
            n_iters += 1
        return acc, m_i, l_i, n_iters

    def _fwd_kernel(Q, K, V, O, L, ITERS, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, n_q, n_k,
                    qk_scale_log2, IS_CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
                    DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr,
                    RECORD_ITERS: tl.constexpr):
        h, b = tl.program_id(1), tl.program_id(2).to(tl.int64)
        # Causal: the last query tiles see the most keys; they take the first program ids.
        pid_q = tl.num_programs(0) - 1 - tl.program_id(0) if IS_CAUSAL else tl.program_id(0)
        q0 = pid_q * BLOCK_Q
        offs_q, q_ok, q_offs, _, q_mask = _row_tile(q0, n_q, sqt, 0, HEAD_DIM, BLOCK_Q, BLOCK_D)
        q = _load(Q + b * sqb + h * sqh + q_offs, q_mask, UPCAST_DOT)  # (BQ, BD)
        m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)  # running row max, log2 units
        l_i = tl.zeros([BLOCK_Q], tl.float32)  # running row sum of exp2(s - m_i)
        acc = tl.zeros([BLOCK_Q, BLOCK_D], tl.float32)  # unnormalised output
        # Unmasked: the full key tiles before the one reaching the tile's first query; masked:
        # from there to the last key its last query sees (causal), or the ragged tail.
        hi = tl.minimum(n_k, q0 + BLOCK_Q) if IS_CAUSAL else n_k
        mid = (tl.minimum(q0, n_k) if IS_CAUSAL else n_k) // BLOCK_K * BLOCK_K
        k_base, v_base = K + b * skb + h * skh, V + b * svb + h * svh
        acc, m_i, l_i, n_iters = _fwd_steps(
            acc, m_i, l_i, tl.full([], 0, tl.int32), q, k_base, v_base, skt, svt, offs_q, 0, mid,
            n_k, qk_scale_log2, False, IS_CAUSAL, HEAD_DIM, BLOCK_K, BLOCK_D, DOT_PRECISION,
            UPCAST_DOT)
        acc, m_i, l_i, n_iters = _fwd_steps(
            acc, m_i, l_i, n_iters, q, k_base, v_base, skt, svt, offs_q, mid, hi, n_k,
            qk_scale_log2, True, IS_CAUSAL, HEAD_DIM, BLOCK_K, BLOCK_D, DOT_PRECISION, UPCAST_DOT)
        tl.store(O + b * sqb + h * sqh + q_offs, (acc / l_i[:, None]).to(O.dtype.element_ty),
                 mask=q_mask)
        bh = b * tl.num_programs(1) + h
        tl.store(L + bh * n_q + offs_q, (m_i + tl.log2(l_i)) * _LN2, mask=q_ok)
        if RECORD_ITERS:  # test hook: how many key tiles this program visited
            tl.store(ITERS + bh * tl.num_programs(0) + pid_q, n_iters)

    def _bwd_delta_kernel(O, DO, DELTA, sqb, sqh, sqt, sdb, sdh, sdt, n_q,
                          HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr):
        # D = rowsum(dO * O) (fp32), BLOCK_Q rows of one (b, h); inside dQ, fp32 dQ would spill.
        h, b = tl.program_id(1), tl.program_id(2).to(tl.int64)
        start = tl.program_id(0) * BLOCK_Q
        offs, ok, o_offs, do_offs, mask = _row_tile(start, n_q, sqt, sdt, HEAD_DIM, BLOCK_Q,
                                                    BLOCK_D)
        o = tl.load(O + b * sqb + h * sqh + o_offs, mask=mask, other=0.0).to(tl.float32)
        do = tl.load(DO + b * sdb + h * sdh + do_offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(DELTA + (b * tl.num_programs(1) + h) * n_q + offs, tl.sum(o * do, 1), mask=ok)

    # Rows past Nq (Q, dO) or Nk (K, V) load as zeros. A query row out of range has L = 0 and
    # score 0: P = 1, times zero rows of dO and Q. A key row out of range has score 0 too, but
    # P = exp(-L) overflows to inf where L < -88, and inf * 0 = NaN: dQ masks such keys (its
    # ragged tile runs masked); in dK/dV they reach only their own rows, which are not stored.

    def _dq_steps(dq, q, do, lse2, delta, k_base, v_base, skt, svt, offs_q, lo, hi, n_k,
                  qk_scale_log2, MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr,
                  HEAD_DIM: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
                  DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr):
        # dQ += dS K over the key tiles lo..hi (unscaled), dS = P * (dO V^T - D); MASKED: keys
        # past n_k, or after the query.
        for start_k in range(lo, hi, BLOCK_K):
            offs_k, k_ok, k_offs, v_offs, kv_mask = _row_tile(start_k, n_k, skt, svt, HEAD_DIM,
                                                              BLOCK_K, BLOCK_D)
            k = _load(k_base + k_offs, kv_mask, UPCAST_DOT)  # (BK, BD)
            v = _load(v_base + v_offs, kv_mask, UPCAST_DOT)
            p = tl.exp2(tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale_log2
                        - lse2[:, None])  # (BQ, BK): the forward's probabilities
            if MASKED:  # a where, not a product: p may be inf there. One compare, causal: key
                # <= min(query, n_k - 1) (both masks as one: two spill on sm_80)
                keep = (offs_k[None, :] <= tl.minimum(offs_q, n_k - 1)[:, None] if IS_CAUSAL
                        else k_ok[None, :])
                p = tl.where(keep, p, 0.0)
            ds = p * (tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION) - delta[:, None])
            dq = tl.dot(_operand(ds, k_base.dtype.element_ty, UPCAST_DOT), k, dq,
                        input_precision=DOT_PRECISION)  # (BQ, BD)
        return dq

    def _bwd_dq_kernel(Q, K, V, DO, L, DELTA, DQ, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt,
                       sdb, sdh, sdt, n_q, n_k, qk_scale_log2, sm_scale,
                       IS_CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr,
                       BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
                       DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr):
        h, b = tl.program_id(1), tl.program_id(2).to(tl.int64)
        pid_q = tl.num_programs(0) - 1 - tl.program_id(0) if IS_CAUSAL else tl.program_id(0)
        q0 = pid_q * BLOCK_Q  # heaviest first, as in the forward
        offs_q, q_ok, q_offs, do_offs, q_mask = _row_tile(q0, n_q, sqt, sdt, HEAD_DIM, BLOCK_Q,
                                                          BLOCK_D)
        q_at = b * sqb + h * sqh  # where Q's and dQ's slices start
        q = _load(Q + q_at + q_offs, q_mask, UPCAST_DOT)  # (BQ, BD)
        do = _load(DO + b * sdb + h * sdh + do_offs, q_mask, UPCAST_DOT)
        row = (b * tl.num_programs(1) + h) * n_q + offs_q
        lse2 = tl.load(L + row, mask=q_ok, other=0.0) * _LOG2E  # (BQ,) log2 units
        delta = tl.load(DELTA + row, mask=q_ok, other=0.0)
        dq = tl.zeros([BLOCK_Q, BLOCK_D], tl.float32)
        hi = tl.minimum(n_k, q0 + BLOCK_Q) if IS_CAUSAL else n_k  # the forward's bounds
        mid = (tl.minimum(q0, n_k) if IS_CAUSAL else n_k) // BLOCK_K * BLOCK_K
        k_base, v_base = K + b * skb + h * skh, V + b * svb + h * svh
        dq = _dq_steps(dq, q, do, lse2, delta, k_base, v_base, skt, svt, offs_q, 0, mid, n_k,
                       qk_scale_log2, False, IS_CAUSAL, HEAD_DIM, BLOCK_K, BLOCK_D, DOT_PRECISION,
                       UPCAST_DOT)
        dq = _dq_steps(dq, q, do, lse2, delta, k_base, v_base, skt, svt, offs_q, mid, hi, n_k,
                       qk_scale_log2, True, IS_CAUSAL, HEAD_DIM, BLOCK_K, BLOCK_D, DOT_PRECISION,
                       UPCAST_DOT)
        tl.store(DQ + q_at + q_offs, (dq * sm_scale).to(DQ.dtype.element_ty), mask=q_mask)

    def _dkdv_steps(dk, dv, k, v, q_base, do_base, l_base, d_base, sqt, sdt, offs_k, lo, hi, n_q,
                    qk_scale_log2, MASKED: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
                    UPCAST_DOT: tl.constexpr):
        # dV += P^T dO, dK += dS^T Q over the query tiles lo..hi (dK unscaled); P^T and dS^T are
        # (BK, BQ) tiles, so only the loaded Q and dO tiles are transposed. MASKED: causal.
        for start_q in range(lo, hi, BLOCK_Q):
            offs_q, q_ok, q_offs, do_offs, q_mask = _row_tile(start_q, n_q, sqt, sdt, HEAD_DIM,
                                                              BLOCK_Q, BLOCK_D)
            q = _load(q_base + q_offs, q_mask, UPCAST_DOT)  # (BQ, BD)
            do = _load(do_base + do_offs, q_mask, UPCAST_DOT)
            lse2 = tl.load(l_base + offs_q, mask=q_ok, other=0.0) * _LOG2E  # (BQ,) log2 units
            delta = tl.load(d_base + offs_q, mask=q_ok, other=0.0)
            p_t = tl.exp2(tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION) * qk_scale_log2
                          - lse2[None, :])  # P^T (BK, BQ)
            if MASKED:
                p_t = tl.where(offs_q[None, :] >= offs_k[:, None], p_t, 0.0)
            dv = tl.dot(_operand(p_t, do_base.dtype.element_ty, UPCAST_DOT), do, dv,
                        input_precision=DOT_PRECISION)  # (BK, BD)
            dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)  # (dO V^T)^T
            ds_t = _operand(p_t * (dp_t - delta[None, :]), q_base.dtype.element_ty, UPCAST_DOT)
            dk = tl.dot(ds_t, q, dk, input_precision=DOT_PRECISION)
        return dk, dv

    def _bwd_dkdv_kernel(Q, K, V, DO, L, DELTA, DK, DV, sqb, sqh, sqt, skb, skh, skt, svb, svh,
                         svt, sdb, sdh, sdt, n_q, n_k, qk_scale_log2, sm_scale,
                         IS_CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr,
                         BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
                         DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr):
        h, b = tl.program_id(1), tl.program_id(2).to(tl.int64)
        k0 = tl.program_id(0) * BLOCK_K  # the first programs see the most queries: heavy first
        offs_k, k_ok, k_offs, v_offs, kv_mask = _row_tile(k0, n_k, skt, svt, HEAD_DIM, BLOCK_K,
                                                          BLOCK_D)
        k_at, v_at = b * skb + h * skh, b * svb + h * svh  # where the slices start
        k = _load(K + k_at + k_offs, kv_mask, UPCAST_DOT)
        v = _load(V + v_at + v_offs, kv_mask, UPCAST_DOT)
        dk = tl.zeros([BLOCK_K, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_K, BLOCK_D], tl.float32)
        # Causal: queries before k0 see none of these keys; masked from the query tile holding k0
        # up to the first tile whose first query sees the tile's last key, then unmasked.
        lo = k0 // BLOCK_Q * BLOCK_Q if IS_CAUSAL else 0
        mid = tl.minimum(tl.cdiv(k0 + BLOCK_K - 1, BLOCK_Q) * BLOCK_Q, n_q) if IS_CAUSAL else 0
        row = (b * tl.num_programs(1) + h) * n_q
        q_base, do_base = Q + b * sqb + h * sqh, DO + b * sdb + h * sdh
        dk, dv = _dkdv_steps(dk, dv, k, v, q_base, do_base, L + row, DELTA + row, sqt, sdt,
                             offs_k, lo, mid, n_q, qk_scale_log2, True, HEAD_DIM, BLOCK_Q,
                             BLOCK_D, DOT_PRECISION, UPCAST_DOT)
        dk, dv = _dkdv_steps(dk, dv, k, v, q_base, do_base, L + row, DELTA + row, sqt, sdt,
                             offs_k, mid, n_q, n_q, qk_scale_log2, False, HEAD_DIM, BLOCK_Q,
                             BLOCK_D, DOT_PRECISION, UPCAST_DOT)
        tl.store(DK + k_at + k_offs, (dk * sm_scale).to(DK.dtype.element_ty), mask=kv_mask)
        tl.store(DV + v_at + v_offs, dv.to(DV.dtype.element_ty), mask=kv_mask)

    _DEVICE_FUNCTIONS = (_row_tile, _operand, _load, _fwd_steps, _dq_steps, _dkdv_steps)


@functools.cache
def _kernels(interpret: bool) -> dict[str, Any]:
    """The kernels, jitted for the compiler or the interpreter (Triton decides at jit time), after
    their device functions, which Triton finds by global name: jitted in the kernels' mode."""
    del interpret  # only the cache key: triton.jit reads TRITON_INTERPRET itself
    for fn in _DEVICE_FUNCTIONS:
        globals()[fn.__name__] = triton.jit(fn)
    return {"fwd": triton.jit(_fwd_kernel), "delta": triton.jit(_bwd_delta_kernel),
            "dq": triton.jit(_bwd_dq_kernel), "dkdv": triton.jit(_bwd_dkdv_kernel)}


# --- launching ------------------------------------------------------------------------------------

def _interpreting(q: torch.Tensor) -> bool:
    """Whether q's kernels run in Triton's interpreter (any non-CUDA tensor, or the variable)."""
    from lmperf.kernels import triton_interpreter

    return q.device.type != "cuda" or triton_interpreter()


def launch_arguments(kernel: str, dtype: torch.dtype, head_dim: int, interpret: bool,
                     block_q: int | None = None, block_k: int | None = None,
                     tiles: TileConfig | None = None) -> dict[str, Any]:
    """`kernel`'s constexpr arguments and, unless `interpret`, compile options for `dtype` and
    `head_dim`: tiles `block_q` / `block_k`, else `tiles`' (default: the default config on CUDA,
    INTERPRETER_BLOCKS in the interpreter). SpecError for a tile not a power of two >= 16."""
    tiles = tiles or (None if interpret else fc.default_config(kernel, dtype, head_dim))
    opts = {} if interpret else {"num_warps": tiles.num_warps, "num_stages": tiles.num_stages}
    shape = {"HEAD_DIM": head_dim, "BLOCK_D": max(MIN_BLOCK, 1 << (head_dim - 1).bit_length())}
    if kernel == "delta":  # no loop: DELTA_ROWS rows a program, nothing to choose
        return {"BLOCK_Q": fc.DELTA_ROWS, **shape, **opts}
    bq = block_q or (tiles.block_q if tiles else INTERPRETER_BLOCKS[0])
    bk = block_k or (tiles.block_k if tiles else INTERPRETER_BLOCKS[1])
    for name, b in (("block_q", bq), ("block_k", bk)):
        if b < MIN_BLOCK or b & (b - 1):
            raise SpecError(f"flash-triton {name} must be a power of two >= {MIN_BLOCK}, got {b}")
    return {"BLOCK_Q": bq, "BLOCK_K": bk, **shape,  # BLOCK_D: d padded to a power of two >= 16
            "DOT_PRECISION": "ieee" if dtype == torch.float32 else "tf32",  # ignored for 16-bit
            "UPCAST_DOT": interpret and dtype == torch.bfloat16, **opts}


def _launch(kernel: str, grid: Callable[[dict], tuple], args: tuple, q: torch.Tensor,
            n_k: int, is_causal: bool, blocks: tuple, **constexprs: Any) -> None:
    """Launch `kernel` on `args` (q: (B, H, Nq, d)): in the interpreter with its one small
    config; on CUDA with explicit `blocks`, or as flash_configs chooses (fp32, delta: defaults)."""
    interpret, d = _interpreting(q), q.shape[-1]
    fn = _kernels(interpret)[kernel]

    def run(tiles: TileConfig | None) -> None:
        cfg = launch_arguments(kernel, q.dtype, d, interpret, *blocks, tiles=tiles)
        fn[grid(cfg)](*args, **constexprs, **cfg)

    def trial(tiles: TileConfig) -> float:  # median ms; inf: no launch, for what triton.autotune
        try:  # skips (resources, ptxas (Triton >= 3.2), static asserts) or out of memory
            return statistics.median(  # 2 warm-up launches (the first compiles), 10 timed
                dev.time_cuda_calls(lambda: run(tiles), q.device, 2, 10))
        except Exception as exc:  # anything else (a kernel fault) fails the call
            skip = (triton.runtime.OutOfResources, getattr(triton.runtime.errors, "PTXASError", ()),
                    triton.compiler.errors.CompileTimeAssertionFailure)
            if dev.is_oom(exc) or isinstance(exc, skip):
                return math.inf
            raise

    def shortlist() -> list[TileConfig]:  # against what Triton checks at launch
        props = triton.runtime.driver.active.utils.get_device_properties(dev.cuda_index(q.device))
        return fc.candidates(kernel, q.dtype, launch_arguments(kernel, q.dtype, d, True)["BLOCK_D"],
                             props["max_shared_mem"])

    if interpret or kernel == "delta" or any(blocks) or q.dtype == torch.float32:
        return run(None)
    key = fc.search_key(kernel, q.shape[0] * q.shape[1], q.shape[2], n_k, d, q.dtype, is_causal)
    run(fc.choose(key, fc.default_config(kernel, q.dtype, d), trial, shortlist))


def _bhtd(t: torch.Tensor) -> torch.Tensor:
    return t if t.dim() == 4 else t.unsqueeze(1)  # (B, T, d) -> (B, 1, T, d), a view


def flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                  block_q: int | None = None, block_k: int | None = None,
                  record_iters: bool = False,
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Forward on q (B[, H], Nq, d) and k, v (B[, H], Nk, d), laid out as `addressable` leaves
    them. Returns (o like q, L (B[, H], Nq) fp32 row logsumexp in natural-log units, iters
    (B * H, query tiles) int32 key tiles visited per program, or None unless `record_iters`)."""
    o = torch.empty_like(q)  # q's strides: q is dense
    q4, k4, v4, o4 = (_bhtd(t) for t in (q, k, v, o))
    (b, h, n_q, d), n_k = q4.shape, k4.shape[2]
    lse = torch.empty(q.shape[:-1], device=q.device, dtype=torch.float32)
    blocks, iters = (block_q, block_k), lse  # lse: the ITERS argument when not recording
    if record_iters:  # a test hook: tiles fixed (the interpreter's unless given) to size iters
        blocks = tuple(x or i for x, i in zip(blocks, INTERPRETER_BLOCKS))
        iters = torch.zeros(b * h, -(-n_q // blocks[0]), device=q.device, dtype=torch.int32)
    strides = (*q4.stride()[:3], *k4.stride()[:3], *v4.stride()[:3])  # (batch, head, row) each
    _launch("fwd", lambda cfg: (triton.cdiv(n_q, cfg["BLOCK_Q"]), h, b),
            (q4, k4, v4, o4, lse, iters, *strides, n_q, n_k, LOG2E / math.sqrt(d)), q4, n_k,
            is_causal, blocks, IS_CAUSAL=is_causal, RECORD_ITERS=record_iters)
    return o, lse, (iters if record_iters else None)


def flash_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                   lse: torch.Tensor, do: torch.Tensor, is_causal: bool,
                   block_q: int | None = None, block_k: int | None = None,
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward from the forward's q, k, v, o (like q) and L and the upstream gradient `do` (any
    strides, d of unit stride): returns (dq, dk, dv), each like its input."""
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    q4, k4, v4, o4, do4, dq4, dk4, dv4 = (_bhtd(t) for t in (q, k, v, o, do, dq, dk, dv))
    (b, h, n_q, d), n_k = q4.shape, k4.shape[2]
    delta, blocks = torch.empty_like(lse), (block_q, block_k)  # D = rowsum(dO * O), fp32
    rest = (*q4.stride()[:3], *k4.stride()[:3], *v4.stride()[:3], *do4.stride()[:3], n_q, n_k,
            LOG2E / math.sqrt(d), 1.0 / math.sqrt(d))
    _launch("delta", lambda cfg: (triton.cdiv(n_q, cfg["BLOCK_Q"]), h, b),
            (o4, do4, delta, *q4.stride()[:3], *do4.stride()[:3], n_q), q4, n_k, is_causal, blocks)
    _launch("dq", lambda cfg: (triton.cdiv(n_q, cfg["BLOCK_Q"]), h, b),
            (q4, k4, v4, do4, lse, delta, dq4, *rest), q4, n_k, is_causal, blocks,
            IS_CAUSAL=is_causal)
    _launch("dkdv", lambda cfg: (triton.cdiv(n_k, cfg["BLOCK_K"]), h, b),
            (q4, k4, v4, do4, lse, delta, dk4, dv4, *rest), q4, n_k, is_causal, blocks,
            IS_CAUSAL=is_causal)
    return dq, dk, dv


# --- validation and the autograd Function ---------------------------------------------------------

def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise SpecError unless q, k, v are valid flash-triton inputs on a usable device: the
    registry's checks (`lmperf.kernels.check_inputs`), no empty batch, and d <= MAX_HEAD_DIM."""
    from lmperf import kernels

    kernels.check_inputs("flash-triton", q, k, v)
    if q.numel() == 0:
        raise SpecError(f"flash-triton: empty input {tuple(q.shape)}, {tuple(k.shape)}")
    if q.shape[-1] > MAX_HEAD_DIM:
        raise SpecError(f"flash-triton supports d <= {MAX_HEAD_DIM} (padded to a power of two "
                        f">= {MIN_BLOCK}), got d = {q.shape[-1]}")


def addressable(t: torch.Tensor, dense: bool = True) -> torch.Tensor:
    """`t` itself where the kernels read it in place (d of unit stride and, if `dense`, laid out
    as (B, H, T, d) or its (B, T, H, d) transpose, so that empty_like keeps its strides), else a
    contiguous copy."""
    dense = not dense or t.is_contiguous() or t.transpose(-3, -2).is_contiguous()
    return t if t.stride(-1) == 1 and dense else t.contiguous()


class FlashAttentionTriton(torch.autograd.Function):
    """FlashAttention-2 with Triton kernels; saves exactly q, k, v, o and L (batch[, heads], Nq).
    `.apply(q, k, v, is_causal=False)` is the course's call; inputs are checked (SpecError)."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                block_q: int | None = None, block_k: int | None = None) -> torch.Tensor:
        check_inputs(q, k, v)
        q, k, v = addressable(q), addressable(k), addressable(v)
        o, lse, _ = flash_forward(q, k, v, bool(is_causal), block_q, block_k)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal, ctx.blocks = bool(is_causal), (block_q, block_k)
        return o

    @staticmethod
    def backward(ctx, do: torch.Tensor):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = flash_backward(q, k, v, o, lse, addressable(do, dense=False), ctx.is_causal,
                                    *ctx.blocks)
        return dq, dk, dv, None, None, None


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
