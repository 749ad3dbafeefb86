"""Fixtures of the train tests: one intra-op thread (restored after), clean global torch state.

One thread: a tiny model's step is as fast on one thread as on two here, and it keeps the steps
immune to the stalls that other processes on a 2-core machine cause in a two-thread pool
(steps measured at 7 ms quiet and up to 1 s under load with two threads).
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="package", autouse=True)
def _one_thread():
    """Package scope, so that module-scoped runs (set up before function fixtures) get it too."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _clean_globals():
    dtype = torch.get_default_dtype()
    precision = torch.get_float32_matmul_precision()
    yield
    torch.set_default_dtype(dtype)
    torch.set_float32_matmul_precision(precision)
    assert not torch.is_autocast_enabled("cpu"), "a test left autocast on"
