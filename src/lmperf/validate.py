"""The input checks every spec and option module shares; each raises a one-line SpecError."""

from __future__ import annotations

from typing import Iterable

from lmperf.errors import SpecError


def positive_int(name: str, value: object) -> int:
    """Return `value` if it is an int > 0 (bools refused), else raise SpecError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SpecError(f"{name} must be a positive integer, got {value!r}")
    return value


def non_negative_int(name: str, value: object) -> int:
    """Return `value` if it is an int >= 0 (bools refused), else raise SpecError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SpecError(f"{name} must be a non-negative integer, got {value!r}")
    return value


def choice(name: str, value: str, accepted: Iterable[str]) -> str:
    """Return `value` if it is one of `accepted`, else raise SpecError listing them."""
    accepted = list(accepted)
    if value not in accepted:
        raise SpecError(f"unknown {name} {value!r}; accepted: {', '.join(accepted)}")
    return value
