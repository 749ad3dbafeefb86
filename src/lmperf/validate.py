"""The input checks every spec and option module shares; each raises a one-line SpecError."""

from __future__ import annotations

import math
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


def finite_number(name: str, value: object, *, positive: bool = False,
                  non_zero: bool = False) -> float:
    """Return `value` as a float if it is a finite number (> 0 with `positive`, != 0 with
    `non_zero`), else raise SpecError naming `name`."""
    if not (isinstance(value, (int, float)) and math.isfinite(value)
            and (value > 0 if positive else value != 0 if non_zero else True)):
        what = "a positive finite" if positive else "a finite non-zero" if non_zero else "a finite"
        raise SpecError(f"{name} must be {what} number, got {value!r}")
    return float(value)


def positive_floats(name: str, values: Iterable[object]) -> list[float]:
    """`values` as floats if they are one or more positive finite numbers, else SpecError."""
    values = [float(v) for v in values]
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise SpecError(f"{name} must be one or more positive finite numbers, got {values}")
    return values


def subset(name: str, values: Iterable[str], accepted: Iterable[str]) -> list[str]:
    """`values`, repeats dropped, if they are one or more of `accepted`; else SpecError
    naming the unknown ones ('unknown {name}(s) [...]; accepted: ...')."""
    names, accepted = list(dict.fromkeys(values)), list(accepted)
    bad = [n for n in names if n not in accepted]
    if bad or not names:
        raise SpecError(f"unknown {name}(s) {bad or names!r}; accepted: {', '.join(accepted)}")
    return names


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


def checkpoint_policy(value: object, flag: str = "--checkpoint") -> str | int:
    """THE parse of an activation-checkpointing policy, to its canonical value: 'none', 'full'
    (every block), 'op' (torchtitan's per-op selective policy), 'every-K' (K >= 2: one block
    in K) or an int G >= 2 (groups of G blocks). Accepted spellings: those, an int or a digit
    string (0 = 'none', 1 = 'full', the aliases of records before issue 41), and 'every-1'
    ('full'). Raises SpecError naming `flag`. The one definition: lmperf.core.vocabulary
    declares the option with it; it lives here so that the model layer can call it too."""
    text = str(value).strip().lower() if isinstance(value, str) else value
    if isinstance(text, str) and text.isdigit():
        text = int(text)
    if isinstance(text, str) and text.startswith("every-") and text[6:].isdigit():
        k = int(text[6:])
        if k >= 1:
            return "full" if k == 1 else f"every-{k}"
    elif isinstance(text, int) and not isinstance(text, bool) and text >= 0:
        return {0: "none", 1: "full"}.get(text, text)
    elif text in ("none", "full", "op"):
        return text
    raise SpecError(f"{flag}: unknown checkpointing policy {value!r}; accepted: none, full (every "
                    "block), op (torchtitan's per-op selective policy), every-K (one block in "
                    "K), or G (groups of G blocks; 0 = none, 1 = full)")


def checkpoint_every(policy: str | int) -> int | None:
    """K of an 'every-K' policy (canonical, as `checkpoint_policy` returns it); None otherwise."""
    return int(policy[6:]) if isinstance(policy, str) and policy.startswith("every-") else None


def checkpoint_order(policy: str | int) -> tuple[int, int]:
    """A sort key of canonical policies: none, full, groups of G (ascending), every-K
    (ascending), op; so a trade-off table starts from its baseline."""
    if isinstance(policy, int):
        return (2, policy)
    k = checkpoint_every(policy)
    return (3, k) if k else ({"none": 0, "full": 1, "op": 4}[policy], 0)


# The regimes float8 trains beside: torchao casts a Linear's bf16 (or, under autocast, its
# autocast dtype's) inputs to float8 and back; torchtitan trains float8 with bf16 FSDP mixed
# precision. fp32 (nothing in bf16 to compare with) and fp16 (rowwise scaled matmuls give bf16
# only) are refused.
FLOAT8_REGIMES: tuple[str, ...] = ("bf16-mixed", "bf16-true")


def check_float8(recipe: object, precision: str) -> str:
    """Return `recipe` if it is a float8 recipe that can train beside regime `precision`
    ('none' beside any); else raise SpecError in one line naming --float8."""
    from lmperf.names import FLOAT8_RECIPES

    if recipe not in FLOAT8_RECIPES:
        raise SpecError(f"--float8: unknown recipe {recipe!r}; accepted: "
                        f"{', '.join(FLOAT8_RECIPES)}")
    if recipe != "none" and precision not in FLOAT8_REGIMES:
        raise SpecError(f"--float8 {recipe} trains beside a bf16 regime "
                        f"({' or '.join(FLOAT8_REGIMES)}), not {precision}: its Linear layers "
                        "cast bf16 to float8 and back")
    return recipe


def checkpoint_phrase(policy: str | int) -> str:
    """A canonical policy in words: 'no checkpointing', 'checkpointing every block',
    "torchtitan's per-op selective checkpointing", 'checkpointing one block in K',
    'checkpointing groups of G blocks'."""
    k = checkpoint_every(policy)
    if k:
        return f"checkpointing one block in {k}"
    return {"none": "no checkpointing", "full": "checkpointing every block",
            "op": "torchtitan's per-op selective checkpointing"}.get(
        policy, f"checkpointing groups of {policy} blocks")  # type: ignore[arg-type]
