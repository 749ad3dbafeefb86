"""nccl-tests' bandwidth definitions, checked by hand."""

from __future__ import annotations

import pytest

from lmperf.estimate.formulas import bandwidths, bus_factor
from lmperf.questions.parallel.plan import parse_size
from lmperf.errors import SpecError


@pytest.mark.parametrize("collective, n, factor", [
    ("all_reduce", 2, 1.0), ("all_reduce", 4, 1.5), ("all_reduce", 8, 1.75),
    ("all_gather", 4, 0.75), ("reduce_scatter", 4, 0.75), ("all_to_all", 2, 0.5),
    ("broadcast", 8, 1.0)])
def test_bus_factors_are_nccl_tests(collective: str, n: int, factor: float) -> None:
    assert bus_factor(collective, n) == pytest.approx(factor)


def test_bandwidths_from_size_and_time() -> None:
    # 1e9 bytes in 0.5 s: algbw 2 GB/s; all-reduce over 4 ranks moves 2 * 3/4 of it per link
    assert bandwidths(10**9, 0.5, "all_reduce", 4) == pytest.approx((2.0, 3.0))
    with pytest.raises(ValueError):
        bus_factor("gather", 2)


@pytest.mark.parametrize("text, size", [("1KiB", 1024), ("16MiB", 16 * 2**20), ("1MB", 10**6),
                                        ("1GB", 10**9), ("4096", 4096), (512, 512)])
def test_parse_size(text: object, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["1 parsec", "-3", "0", "KiB"])
def test_parse_size_refuses(bad: str) -> None:
    with pytest.raises(SpecError):
        parse_size(bad)
