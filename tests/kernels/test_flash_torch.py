"""flash-torch (FlashAttention-2 in PyTorch) against the float64 reference, and its contracts."""

from __future__ import annotations

import functools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lmperf.errors import SpecError
from lmperf.kernels.flash_torch import FlashAttentionTorch, flash_attention_torch, flash_forward
from lmperf.kernels.reference import reference_attention, reference_forward_backward
from tests.kernels.conftest import assert_close_to_reference, forward_backward, make_inputs

# Sequence lengths 1, 17 and 100 are multiples of no tile size used here; (32, 16) tiles make a
# query tile span several key tiles, (16, 32) the other way round.
SHAPES = [(2, 1, 16), (3, 17, 16), (2, 3, 100, 32)]
BLOCKS = [(64, 64), (16, 32), (32, 16)]


def _flash(block_q: int, block_k: int):
    return functools.partial(flash_attention_torch, block_q=block_q, block_k=block_k)


def _check(fn, q, k, v, do, is_causal, dtype):
    got = forward_backward(fn, q, k, v, do, is_causal)
    ref = reference_forward_backward(q, k, v, do, is_causal)
    assert got[0].dtype == q.dtype and got[0].shape == q.shape
    for what, a, b in zip(("o", "dq", "dk", "dv"), got, ref):
        assert a.dtype == q.dtype, what
        assert_close_to_reference(a, b, dtype, what)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("blocks", BLOCKS, ids=lambda b: f"b{b[0]}x{b[1]}")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fp32_forward_and_gradients_match_float64(shape, blocks, is_causal):
    q, k, v, do = make_inputs(shape)
    _check(_flash(*blocks), q, k, v, do, is_causal, torch.float32)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n_q,n_k", [(37, 100), (100, 37)])
def test_different_query_and_key_lengths(n_q, n_k, is_causal):
    # Causal is top-left aligned like SDPA; with n_q > n_k the last queries see every key.
    q, k, v, do = make_inputs((2, 2, n_q, 16), n_k=n_k)
    _check(_flash(16, 32), q, k, v, do, is_causal, torch.float32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_low_precision_within_its_tolerance(dtype, is_causal):
    q, k, v, do = make_inputs((2, 2, 100, 32), dtype=dtype)
    _check(_flash(32, 16), q, k, v, do, is_causal, dtype)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_float64_gradcheck(is_causal):
    # float64 inputs run with float64 accumulators, so the analytic backward can be checked
    # against finite differences exactly. fast_mode checks random projections of the Jacobian:
    # a few dozen forwards instead of one per input element.
    q, k, v = (torch.randn(1, 2, 21, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    fn = functools.partial(flash_attention_torch, is_causal=is_causal, block_q=16, block_k=16)
    assert torch.autograd.gradcheck(fn, (q, k, v), fast_mode=True)


# -- the saved-tensor contract ------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 33, 16), (2, 3, 33, 16)], ids=["3d", "4d"])
def test_saves_exactly_q_k_v_o_and_logsumexp(shape):
    q, k, v, _ = (t.requires_grad_(True) for t in make_inputs(shape))
    packed: list[tuple[tuple[int, ...], torch.dtype]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        packed.append((tuple(t.shape), t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        o = flash_attention_torch(q, k, v, is_causal=True, block_q=16, block_k=16)
    lead, n_q = shape[:-2], shape[-2]
    assert packed == [(shape, torch.float32)] * 4 + [((*lead, n_q), torch.float32)]

    saved = o.grad_fn.saved_tensors
    assert len(saved) == 5
    for got, want in zip(saved[:3], (q, k, v)):
        assert got.data_ptr() == want.data_ptr() and got.shape == want.shape
    assert saved[3].data_ptr() == o.data_ptr()
    lse = saved[4]
    assert lse.shape == (*lead, n_q)
    # L is the row logsumexp of the (masked) scaled scores
    s = (q.double() @ k.double().transpose(-2, -1)) / shape[-1] ** 0.5
    s = s.masked_fill(torch.ones(n_q, n_q, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(lse.double(), torch.logsumexp(s, dim=-1), atol=1e-5, rtol=1e-5)


def test_function_is_the_autograd_node():
    q, k, v, _ = (t.requires_grad_(True) for t in make_inputs((1, 20, 16)))
    o = flash_attention_torch(q, k, v)
    assert type(o.grad_fn).__name__ == f"{FlashAttentionTorch.__name__}Backward"


# -- causal tile skipping -----------------------------------------------------------------------

class _CountBmm(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.bmm = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.bmm += func is torch.ops.aten.bmm.default
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("t,blocks,full_tiles,causal_tiles", [
    (128, (32, 32), 16, 10),   # 4 x 4 tiles; causal keeps the 10 on or below the diagonal
    (100, (32, 16), 28, 19),   # 4 query tiles x 7 key tiles; causal: 2 + 4 + 6 + 7 (ragged)
])
def test_causal_forward_skips_fully_masked_key_tiles(t, blocks, full_tiles, causal_tiles):
    q, k, v, _ = make_inputs((1, t, 16))
    for is_causal, tiles in ((False, full_tiles), (True, causal_tiles)):
        with _CountBmm() as count:
            flash_forward(q, k, v, is_causal, *blocks)
        assert count.bmm == 2 * tiles  # S = Q K^T and P V per visited tile


# -- autocast, compiled backward, bad arguments -------------------------------------------------

def test_autocast_does_not_lower_the_inner_precision():
    q, k, v, do = make_inputs((2, 2, 40, 16))
    plain = forward_backward(_flash(16, 16), q, k, v, do, True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = forward_backward(_flash(16, 16), q, k, v, do, True)
    for a, b in zip(plain, under):
        assert a.dtype == b.dtype == torch.float32
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("blocks", [(8, 64), (64, 15), (64, 0), (32.0, 32)])
def test_tiles_below_16_are_rejected(blocks):
    q, k, v, _ = make_inputs((1, 20, 16))
    with pytest.raises(SpecError, match=r"flash-torch block_[qk] must be an integer >= 16"):
        flash_attention_torch(q, k, v, block_q=blocks[0], block_k=blocks[1])


def test_no_grad_forward_matches_reference():
    q, k, v, _ = make_inputs((2, 2, 50, 16))
    with torch.no_grad():
        o = flash_attention_torch(q, k, v, is_causal=True)
    assert_close_to_reference(o, reference_attention(q, k, v, True), torch.float32)
