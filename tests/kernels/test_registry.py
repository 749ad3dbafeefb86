"""The attention registry: every implementation against float64, input checks, supports()."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from lmperf import kernels
from lmperf.errors import SpecError
from lmperf.kernels.reference import reference_forward_backward
from tests.kernels.conftest import (TRITON_USABLE, assert_close_to_reference, forward_backward,
                                    make_inputs)

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
runs_triton = pytest.mark.skipif(
    not (HAS_TRITON and TRITON_USABLE),
    reason="triton is not installed, was imported before TRITON_INTERPRET=1 could be set, or "
           "its interpreter cannot run with this numpy (kernels.interpreter_gap)")

# flash-triton runs on the CPU through Triton's interpreter (set per test, see _impl below).
EAGER = ["naive", "sdpa", "flash-torch",
         pytest.param("flash-triton", marks=runs_triton)]
SHAPES = [(2, 1, 16), (3, 17, 16), (2, 3, 100, 32)]


@pytest.fixture
def interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _impl(name: str, monkeypatch: pytest.MonkeyPatch):
    if name == "flash-triton":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    return kernels.get(name)


def _check(fn, q, k, v, do, is_causal, dtype):
    got = forward_backward(fn, q, k, v, do, is_causal)
    ref = reference_forward_backward(q, k, v, do, is_causal)
    assert got[0].shape == q.shape and got[0].dtype == q.dtype
    for what, a, b in zip(("o", "dq", "dk", "dv"), got, ref):
        assert_close_to_reference(a, b, dtype, what)


def test_names():
    assert kernels.NAMES == ("naive", "sdpa", "compiled", "flash-torch", "flash-triton")


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", EAGER)
def test_fp32_matches_float64(name, shape, is_causal, monkeypatch):
    q, k, v, do = make_inputs(shape)
    _check(_impl(name, monkeypatch), q, k, v, do, is_causal, torch.float32)


@pytest.mark.parametrize("n_q,n_k", [(37, 100), (100, 37)])
@pytest.mark.parametrize("name", EAGER)
def test_causal_is_top_left_aligned_for_unequal_lengths(name, n_q, n_k, monkeypatch):
    # query i sees keys 0..i, as in F.scaled_dot_product_attention(is_causal=True)
    q, k, v, do = make_inputs((2, 2, n_q, 16), n_k=n_k)
    _check(_impl(name, monkeypatch), q, k, v, do, True, torch.float32)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", EAGER)
def test_bf16_matches_float64_within_its_tolerance(name, is_causal, monkeypatch):
    q, k, v, do = make_inputs((2, 2, 100, 32), dtype=torch.bfloat16)
    _check(_impl(name, monkeypatch), q, k, v, do, is_causal, torch.bfloat16)


@pytest.mark.compile
def test_compiled_matches_float64():
    # One small shape: the first call compiles (C++ on CPU). It is the reference LM's attention
    # shape in tests/model/test_attention_impls.py, so that test reuses the compiled graph.
    q, k, v, do = make_inputs((3, 4, 16, 4))
    _check(kernels.get("compiled"), q, k, v, do, True, torch.float32)


def test_default_is_not_causal():
    q, k, v, _ = make_inputs((1, 9, 16))
    for name in ("naive", "sdpa", "flash-torch"):
        o = kernels.get(name)(q, k, v)
        ref, *_ = reference_forward_backward(q, k, v, torch.zeros_like(q), is_causal=False)
        assert_close_to_reference(o, ref, torch.float32, name)


# -- bad input ----------------------------------------------------------------------------------

BAD_SHAPES = [
    ((2, 16), (2, 16), (2, 16), r"must all be \(batch, seq, d\) or \(batch, heads, seq, d\)"),
    ((1, 2, 2, 8, 16),) * 3 + ("must all be",),
    ((2, 8, 16), (2, 1, 8, 16), (2, 1, 8, 16), "must all be"),
    ((2, 8, 16), (3, 8, 16), (3, 8, 16), "batch/head dims differ"),
    ((2, 4, 8, 16), (2, 2, 8, 16), (2, 2, 8, 16), "batch/head dims differ"),
    ((2, 8, 16), (2, 9, 16), (2, 8, 16), "k and v have different sequence lengths"),
    ((2, 8, 16), (2, 8, 32), (2, 8, 32), r"head dims \(d\) differ"),
    ((2, 8, 16), (2, 8, 16), (2, 8, 8), r"head dims \(d\) differ"),
    ((2, 0, 16), (2, 8, 16), (2, 8, 16), "empty sequence"),
]


@pytest.mark.parametrize("name", kernels.NAMES)
@pytest.mark.parametrize("qs,ks,vs,message", BAD_SHAPES)
def test_mismatched_shapes_raise_one_line(name, qs, ks, vs, message):
    if name == "flash-triton" and not HAS_TRITON:
        pytest.skip("triton is not installed")
    fn = kernels.get(name)
    with pytest.raises(SpecError, match=message) as info:
        fn(torch.randn(qs), torch.randn(ks), torch.randn(vs), False)
    assert "\n" not in str(info.value) and str(info.value).startswith(f"{name}: ")


def test_mixed_dtypes_and_integer_tensors_are_rejected():
    q, k, v, _ = make_inputs((1, 8, 16))
    with pytest.raises(SpecError, match="flash-torch: q, k, v dtypes differ: float32, bfloat16"):
        kernels.get("flash-torch")(q, k.bfloat16(), v)
    with pytest.raises(SpecError, match="naive does not support int64"):
        kernels.get("naive")(*(torch.ones(1, 8, 16, dtype=torch.long),) * 3)


@needs_triton
def test_flash_triton_rejects_float64(interpreter):
    q, k, v, _ = make_inputs((1, 8, 16), dtype=torch.float64)
    with pytest.raises(SpecError, match=r"flash-triton does not support float64 \(supported:"):
        kernels.get("flash-triton")(q, k, v)


def test_unknown_name_lists_the_accepted_ones():
    with pytest.raises(SpecError, match="unknown attention implementation 'flash'; accepted: "
                                        "naive, sdpa, compiled, flash-torch, flash-triton"):
        kernels.get("flash")


def test_flash_triton_without_triton_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "triton" else real(name, *a))
    with pytest.raises(SpecError, match=r"^flash-triton needs triton; pip install triton$"):
        kernels.get("flash-triton")
    assert kernels.supports("flash-triton", "cuda", torch.float16) == (
        "flash-triton needs triton; pip install triton")


# -- supports() ---------------------------------------------------------------------------------

def test_supports_common_cases(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for name in ("naive", "sdpa", "flash-torch"):
        for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
            assert kernels.supports(name, "cpu", dtype) is None
    assert "does not support float64" in kernels.supports("flash-triton", "cuda", torch.float64)
    assert "does not support int32" in kernels.supports("sdpa", "cpu", torch.int32)
    assert kernels.supports("nope", "cpu", torch.float32).startswith("unknown attention")
    if HAS_TRITON:
        reason = kernels.supports("flash-triton", "cpu", torch.float32)
        assert "needs a CUDA device, or TRITON_INTERPRET=1" in reason
        assert kernels.supports("flash-triton", "cuda", torch.bfloat16) is None
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        assert kernels.supports("flash-triton", "cpu", torch.float32) == kernels.interpreter_gap()


def test_a_triton_interpreter_that_cannot_run_with_this_numpy_is_named(monkeypatch):
    # Triton 3.6 with numpy 2.4: every interpreted call failed with "only 0-dimensional arrays"
    import importlib.metadata as md

    real = md.version
    for triton_v, numpy_v, broken in (("3.6.0", "2.4.6", True), ("3.7.0", "2.4.6", False),
                                      ("3.6.0", "2.3.5", False), ("3.9.0", "2.4.6", False)):
        versions = {"triton": triton_v, "numpy": numpy_v}
        monkeypatch.setattr(md, "version", lambda name, v=versions: v.get(name) or real(name))
        gap = kernels.interpreter_gap()
        assert (gap is not None) == broken and (not gap or "triton-lang/triton#9171" in gap)


@needs_triton
def test_flash_triton_on_cpu_without_interpreter_is_a_spec_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q, k, v, _ = make_inputs((1, 8, 16))
    with pytest.raises(SpecError, match="flash-triton"):
        kernels.get("flash-triton")(q, k, v)


def test_validate_false_returns_the_bare_function():
    assert kernels.get("naive", validate=False) is kernels.naive_attention
    assert kernels.get("sdpa", validate=False) is kernels.sdpa_attention


# -- sdpa_backend -------------------------------------------------------------------------------

def test_sdpa_backend_reports_what_torch_dispatched():
    q, k, v, _ = make_inputs((2, 2, 32, 16))
    # On this CPU, 4-D inputs take the fused flash kernel (aten::_scaled_dot_product_flash_
    # attention_for_cpu); forcing the math backend must be reported as such.
    assert kernels.sdpa_backend(q, k, v, True) in {"flash_attention", "math"}
    with sdpa_kernel(SDPBackend.MATH):
        assert kernels.sdpa_backend(q, k, v, True) == "math"
    if q.device.type == "cpu":
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            assert kernels.sdpa_backend(q, k, v, False) == "flash_attention"
