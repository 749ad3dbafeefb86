"""flash-triton against the float64 reference, run on the CPU through Triton's interpreter."""

# On a CPU these tests run through Triton's interpreter, which tests/conftest.py turns on for
# the whole session before anything imports triton (Triton picks its mode at import).
import math

import pytest
import torch

pytest.importorskip("triton")

from lmperf.errors import SpecError
from lmperf.kernels import IMPLEMENTATIONS, interpreter_gap

if not torch.cuda.is_available() and interpreter_gap():
    pytest.skip(interpreter_gap(), allow_module_level=True)
from lmperf.kernels import flash_configs as fc
from lmperf.kernels import flash_triton as ft
from lmperf.kernels.reference import reference_forward_backward
from tests.kernels.conftest import assert_close_to_reference


@pytest.fixture(autouse=True)
def _interpreter(monkeypatch):
    """Every test runs with the interpreter on and a fixed seed (restored afterwards)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    state = torch.random.get_rng_state()
    torch.manual_seed(0)
    yield
    torch.random.set_rng_state(state)


def _inputs(shape_q, n_k=None, dtype=torch.float32):
    """q (shape_q), k, v (same but seq n_k), and an upstream gradient shaped like q, all N(0, 1)."""
    shape_k = (*shape_q[:-2], n_k or shape_q[-2], shape_q[-1])
    q = torch.randn(shape_q).to(dtype)
    k, v = torch.randn(shape_k).to(dtype), torch.randn(shape_k).to(dtype)
    return q, k, v, torch.randn(shape_q).to(dtype)


def _check_against_reference(q, k, v, do, is_causal, **blocks):
    """Forward and all three gradients of flash-triton within TOLERANCES[dtype] of float64."""
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    o = ft.flash_attention_triton(*leaves, is_causal=is_causal, **blocks)
    o.backward(do)
    o_ref, dq_ref, dk_ref, dv_ref = reference_forward_backward(q, k, v, do, is_causal)
    assert o.dtype == q.dtype and o.shape == q.shape
    for what, got, ref in (("o", o, o_ref), ("dq", leaves[0].grad, dq_ref),
                           ("dk", leaves[1].grad, dk_ref), ("dv", leaves[2].grad, dv_ref)):
        assert got.dtype == q.dtype and got.shape == ref.shape, what
        assert_close_to_reference(got, ref, q.dtype, what=what)


# Sequence lengths around the interpreter's (32, 16) tiles: 1 (a single, mostly padded tile), 17,
# 100 (ragged), 64 (a multiple, for contrast).
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n, d", [(1, 16), (17, 32), (64, 16), (100, 32)])
def test_fp32_3d_matches_float64(n, d, is_causal):
    _check_against_reference(*_inputs((2, n, d)), is_causal)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n, d", [(17, 16), (100, 32)])
def test_fp32_4d_matches_float64(n, d, is_causal):
    _check_against_reference(*_inputs((2, 2, n, d)), is_causal)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n", [17, 100])
def test_16bit_matches_float64(n, is_causal, dtype):
    # Tolerances from reference.TOLERANCES; bf16 goes through the interpreter-only fp32 widening
    # of dot operands (see the module docstring), fp16 through numpy's fp16 matmul.
    _check_against_reference(*_inputs((1, 2, n, 32), dtype=dtype), is_causal)


@pytest.mark.parametrize("n_q, n_k, is_causal", [(8, 40, False), (40, 24, True)],
                         ids=["full", "causal"])
def test_very_negative_scores_over_ragged_keys_match_float64(n_q, n_k, is_causal):
    # Every scaled score near -228, so each row's logsumexp L is below -88: a key past Nk loads as
    # zeros (score 0), and P = exp(-L) there overflows to inf, so dS K would be inf * 0 = NaN in
    # dQ unless those keys are masked. Nk leaves a ragged key tile (8 of 16); it is reached by
    # every query non-causal, and causal by the query tile past Nk (Nq > Nk). Finite and exact
    # before issue 37, NaN in dQ after it until the ragged tile ran masked again.
    x = (228 * 4 / 16) ** 0.5  # q = x + noise, k = -x + noise: q.k / sqrt(16) ~ -x^2 * 16 / 4
    q, k, v, do = _inputs((1, n_q, 16), n_k=n_k)
    _check_against_reference(x + 0.3 * q, -x + 0.3 * k, v, do, is_causal)


@pytest.mark.parametrize("block_q, block_k", [(16, 16), (16, 32), (64, 16)])
def test_other_tile_sizes(block_q, block_k):
    # Query tiles smaller than, equal to and larger than key tiles move the causal bound around.
    _check_against_reference(*_inputs((1, 100, 16)), True, block_q=block_q, block_k=block_k)


def _with_tiles(monkeypatch, tiles_of):
    """Run each kernel in the interpreter with the tiles `tiles_of(kernel, dtype, d)` gives;
    returns the set of kernels that took them."""
    launch, used = ft.launch_arguments, set()

    def patched(kernel, dtype, head_dim, interpret, block_q=None, block_k=None, tiles=None):
        if kernel not in fc.KERNELS:  # delta: no tiles
            return launch(kernel, dtype, head_dim, interpret, block_q, block_k, tiles)
        chosen = tiles_of(kernel, dtype, head_dim)
        used.add(kernel)
        return launch(kernel, dtype, head_dim, interpret, chosen.block_q, chosen.block_k)

    monkeypatch.setattr(ft, "launch_arguments", patched)
    return used


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("d", [64, 128])
def test_the_default_gpu_tiles_match_float64(d, dtype, monkeypatch):
    # Without a search each kernel takes its own default tiles on CUDA (e.g. fp32 d = 128: dK/dV
    # 16 x 32 beside a 32 x 64 forward and dQ); run exactly those through the interpreter, on 100
    # queries over 100 and over 70 keys, so that every tile is ragged somewhere.
    used = _with_tiles(monkeypatch, fc.default_config)
    for n_k, is_causal in ((100, True), (70, False)):
        _check_against_reference(*_inputs((1, 1, 100, d), n_k=n_k, dtype=dtype), is_causal)
    assert used == set(ft.KERNELS)


@pytest.mark.parametrize("pair", range(5))
def test_every_tile_pair_of_the_search_space_matches_float64(pair, monkeypatch):
    # A search may launch any configuration of the 16-bit space. Warps and stages are compile
    # options; the tiles are what the interpreter can check: pair `pair` (own tile x loop step)
    # of each kernel's space, in bf16, causal over 200 queries (ragged against every tile) and
    # not over 150 keys.
    def tiles_of(kernel, dtype, head_dim):
        own, step = sorted({s[:2] for s in fc.SPACE})[pair]
        return fc.TileConfig(*((step, own) if kernel == "dkdv" else (own, step)), 4, 2)

    used = _with_tiles(monkeypatch, tiles_of)
    for n_k, is_causal in ((200, True), (150, False)):
        _check_against_reference(*_inputs((1, 1, 200, 64), n_k=n_k, dtype=torch.bfloat16),
                                 is_causal)
    assert used == set(ft.KERNELS)


def test_every_kernel_has_a_valid_default_config():
    for kernel in ft.KERNELS:
        for dtype in IMPLEMENTATIONS["flash-triton"].dtypes:
            for d in (1, 16, 64, 65, 128):
                c = fc.default_config(kernel, dtype, d)
                for block in (c.block_q, c.block_k):
                    assert block >= ft.MIN_BLOCK and block & (block - 1) == 0, (kernel, dtype, d)
                assert c.num_warps in (1, 2, 4, 8, 16) and c.num_stages >= 1

@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_head_dim_not_power_of_two_and_unequal_lengths(is_causal):
    # d = 20 is padded to 32 inside the kernel; 37 queries over 70 keys (causal: top-left aligned).
    _check_against_reference(*_inputs((2, 37, 20), n_k=70), is_causal)


def test_expanded_upstream_gradient():
    # o.sum() sends a zero-stride (expanded) dO: backward must not assume a contiguous gradient.
    q, k, v, _ = _inputs((1, 40, 16))
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ft.flash_attention_triton(*leaves, is_causal=True).sum().backward()
    _, dq, dk, dv = reference_forward_backward(q, k, v, torch.ones(1, 40, 16), True)
    for got, ref in zip((t.grad for t in leaves), (dq, dk, dv)):
        assert_close_to_reference(got, ref, torch.float32)


@pytest.mark.parametrize("shape", [(2, 33, 16), (2, 3, 33, 16)], ids=["3d", "4d"])
def test_saves_exactly_q_k_v_o_and_logsumexp(shape):
    saved = []

    def pack(t):
        saved.append(t)
        return t

    q, k, v, _ = _inputs(shape)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        o = ft.flash_attention_triton(q, k, v, is_causal=True)

    assert len(saved) == 5
    for got, want in zip(saved[:4], (q, k, v, o)):  # the tensors themselves, not copies
        assert got.shape == want.shape and got.data_ptr() == want.data_ptr()
    lse = saved[4]
    assert lse.shape == shape[:-1] and lse.dtype == torch.float32  # (batch[, heads], n_queries)
    scores = q.double() @ k.double().transpose(-1, -2) / math.sqrt(shape[-1])
    scores = scores.masked_fill(torch.ones(33, 33, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, -1).detach(),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_a_models_transposed_heads_are_read_in_place(is_causal):
    # q, k, v as a model makes them, (B, T, H, d).transpose(1, 2): no copy is made (autograd
    # saves the inputs themselves), the output and gradients keep their layout (so the model's
    # transpose back is free), and all match float64. Before issue 37: copied, contiguous.
    q, k, v, do = (t.transpose(1, 2).contiguous().transpose(1, 2)
                   for t in _inputs((2, 3, 40, 16)))
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        o = ft.flash_attention_triton(*leaves, is_causal=is_causal)
    o.backward(do)
    assert [t.data_ptr() for t in saved[:3]] == [t.data_ptr() for t in leaves]
    assert o.stride() == q.stride() and all(t.grad.stride() == t.stride() for t in leaves)
    ref = reference_forward_backward(q, k, v, do, is_causal)
    for got, want in zip((o, *(t.grad for t in leaves)), ref):
        assert_close_to_reference(got, want, torch.float32)


def test_a_forward_and_backward_launch_four_kernels(monkeypatch):
    # forward, delta (D = rowsum(dO * O)), dQ, dK/dV and nothing else: no copy either
    # (contiguous inputs and dO).
    kernels, launched = ft._kernels(True), []

    class Counting:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            launched.append(self.name)
            return kernels[self.name][grid]

    monkeypatch.setattr(ft, "_kernels", lambda interpret: {n: Counting(n) for n in kernels})
    q, k, v, do = _inputs((1, 2, 50, 16))
    q.requires_grad_(True)
    ft.flash_attention_triton(q, k, v, is_causal=True).backward(do)
    assert launched == ["fwd", "delta", "dq", "dkdv"]


def test_the_interpreter_never_searches():
    with fc.searching() as searches:
        _check_against_reference(*_inputs((1, 40, 16)), True)
    assert searches == [] and not fc.CHOSEN

@pytest.mark.parametrize("n_q, n_k, block_q, block_k", [(100, 100, 32, 16), (100, 100, 16, 32),
                                                        (37, 70, 16, 16)])
def test_causal_loop_skips_tiles_above_the_diagonal(n_q, n_k, block_q, block_k):
    # The forward kernel records how many key tiles each program's loop actually ran.
    q, k, v, _ = _inputs((2, n_q, 16), n_k=n_k)
    k_tiles = math.ceil(n_k / block_k)
    q_tiles = math.ceil(n_q / block_q)
    _, _, full = ft.flash_forward(q, k, v, False, block_q, block_k, record_iters=True)
    o, _, causal = ft.flash_forward(q, k, v, True, block_q, block_k, record_iters=True)

    assert full.shape == causal.shape == (2, q_tiles)
    assert (full == k_tiles).all()
    # Query tile i's last query is (i + 1) * block_q - 1; key tiles past it are never visited.
    want = [math.ceil(min(n_k, (i + 1) * block_q) / block_k) for i in range(q_tiles)]
    assert causal.tolist() == [want, want]
    assert causal.sum() < full.sum()
    assert_close_to_reference(o, reference_forward_backward(q, k, v, q, True)[0], torch.float32)


@pytest.mark.parametrize("make, match", [
    (lambda: _inputs((1, 8, 16), dtype=torch.float64)[:3], "float64"),
    (lambda: (torch.randn(8, 16),) * 3, r"\(batch, seq, d\)"),
    (lambda: (torch.randn(1, 8, 16), torch.randn(1, 8, 32), torch.randn(1, 8, 32)), "d\) differ"),
    (lambda: (torch.randn(1, 8, 16), torch.randn(1, 9, 16), torch.randn(1, 8, 16)),
     "sequence lengths"),
    (lambda: (torch.randn(1, 8, 16), torch.randn(1, 8, 16).half(), torch.randn(1, 8, 16)),
     "dtypes differ"),
    (lambda: (torch.randn(1, 8, 256),) * 3, "d <= 128"),
    (lambda: (torch.randn(1, 0, 16),) * 3, "empty"),
    (lambda: (torch.randn(0, 8, 16),) * 3, "empty"),
])
def test_bad_input_raises_spec_error(make, match):
    with pytest.raises(SpecError, match=match):
        ft.flash_attention_triton(*make())


def test_bad_tile_size_raises_spec_error():
    with pytest.raises(SpecError, match="power of two"):
        ft.flash_attention_triton(*_inputs((1, 8, 16))[:3], block_q=24)


def test_cpu_without_interpreter_raises_spec_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(SpecError, match=r"or TRITON_INTERPRET=1 to run Triton's interpreter"):
        ft.flash_attention_triton(*_inputs((1, 8, 16))[:3])


def test_missing_triton_is_reported(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "triton" else real(name, *a))
    with pytest.raises(SpecError, match="flash-triton needs triton; pip install triton"):
        ft.flash_attention_triton(*_inputs((1, 8, 16))[:3])  # the registry's one answer

