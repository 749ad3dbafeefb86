"""Shared setup for the attention-kernel tests: global torch state, inputs, the compile marker.

Triton chooses its interpreter when it is imported (its own `@triton.jit` helpers are decorated
then), and importing torch._dynamo imports triton. So on a machine without CUDA this conftest
turns TRITON_INTERPRET=1 on for the session before anything here can import triton, and records
whether that was still possible: if triton was already imported without the interpreter (by an
earlier test), the flash-triton tests skip instead of failing. Without CUDA nothing else in the
project runs Triton (Inductor compiles C++ on the CPU), so the variable changes nothing else.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

_TRITON_IMPORTED_BEFORE = "triton" in sys.modules
_INTERPRET_BEFORE = os.environ.get("TRITON_INTERPRET") == "1"
if not torch.cuda.is_available() and not _TRITON_IMPORTED_BEFORE:
    os.environ.setdefault("TRITON_INTERPRET", "1")
from lmperf.kernels import interpreter_gap  # noqa: E402  (after the variable is set)
from lmperf.kernels.compiled import compile_unavailable_reason  # noqa: E402

TRITON_USABLE = torch.cuda.is_available() or (
    not (_TRITON_IMPORTED_BEFORE and not _INTERPRET_BEFORE) and interpreter_gap() is None)
"""False when triton was imported without the interpreter before this conftest could set it,
or when its interpreter cannot run with this numpy (`interpreter_gap`)."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "compile: runs torch.compile (C++ build on CPU, ~20 s on a cold cache); "
                   "deselect with -m 'not compile', skipped without a C++ compiler")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = None
    for item in items:
        if item.get_closest_marker("compile") is None:
            continue
        reason = reason or compile_unavailable_reason("cpu") or ""
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True)
def _torch_state():
    """Seed 0 for each test; restore the RNG, default dtype and matmul precision afterwards."""
    rng = torch.random.get_rng_state()
    dtype = torch.get_default_dtype()
    precision = torch.get_float32_matmul_precision()
    torch.manual_seed(0)
    yield
    torch.random.set_rng_state(rng)
    torch.set_default_dtype(dtype)
    torch.set_float32_matmul_precision(precision)


def make_inputs(shape_q: tuple[int, ...], n_k: int | None = None,
                dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    """Standard-normal q (shape_q), k and v (seq n_k, default Tq), and dO shaped like q."""
    shape_k = (*shape_q[:-2], n_k or shape_q[-2], shape_q[-1])
    q = torch.randn(shape_q).to(dtype)
    k, v = torch.randn(shape_k).to(dtype), torch.randn(shape_k).to(dtype)
    return q, k, v, torch.randn(shape_q).to(dtype)


def forward_backward(fn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
                     is_causal: bool) -> tuple[torch.Tensor, ...]:
    """(o, dq, dk, dv) of fn(q, k, v, is_causal) on fresh leaves, for upstream gradient do."""
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    o = fn(*leaves, is_causal)
    o.backward(do)
    return (o.detach(), *(t.grad for t in leaves))


def assert_close_to_reference(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype,
                              what: str = "", tf32: bool = False) -> None:
    """Assert `actual` (any dtype) matches the float64 `expected` within `tolerance(dtype)`."""
    from lmperf.kernels.reference import tolerance

    atol, rtol = tolerance(dtype, tf32)
    torch.testing.assert_close(actual.detach().double(), expected.detach().double(),
                               atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}" if what else m)
