"""The input checks every spec and option module shares; each raises a one-line SpecError."""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

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


def check_fields(obj: object, *, choices: Mapping[str, Iterable[str]] | None = None,
                 positive: Iterable[str] = (), non_negative: Iterable[str] = (),
                 named: Callable[[str], str] = str) -> None:
    """Check fields of a spec by name: each of `choices` (field -> accepted values), then the
    `positive` and `non_negative` integers. `named` turns a number field into the name its
    error message uses (e.g. a flag). Raises SpecError at the first bad field."""
    for field, accepted in (choices or {}).items():
        choice(field, getattr(obj, field), accepted)
    for field in positive:
        positive_int(named(field), getattr(obj, field))
    for field in non_negative:
        non_negative_int(named(field), getattr(obj, field))


def as_flag(field: str) -> str:
    """The command-line flag of a spec field, for error messages ('lr_warmup' -> '--lr-warmup')."""
    return f"--{field.replace('_', '-')}"
