"""Shared by the doctor's tests: a CPU context, and torch's global state put back after each
test (checks seed torch, set threads and the float32 matmul precision)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lmperf.questions.doctor.checks import Context


@pytest.fixture
def ctx(tmp_path: Path) -> Context:
    return Context(torch.device("cpu"), tmp_path)


@pytest.fixture(autouse=True)
def _torch_state():
    rng, threads = torch.random.get_rng_state(), torch.get_num_threads()
    precision = torch.get_float32_matmul_precision()
    yield
    torch.random.set_rng_state(rng)
    torch.set_num_threads(threads)
    torch.set_float32_matmul_precision(precision)
