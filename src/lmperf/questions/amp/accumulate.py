"""Summing one small value many times in fp32, fp16 and bf16: where the accumulator stalls, and
the fix (an fp32 accumulator).

Each sum is a Python loop of one scalar add per step on the device, so what is measured is what
the device's elementwise add produces for that pair of dtypes (a vectorised reduction such as
torch.cumsum or torch.sum may accumulate in a wider type and is not the same experiment).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from fractions import Fraction

import pandas as pd
import torch

from lmperf.questions.amp.base import ExperimentResult, dtype_name
from lmperf.questions.amp.formats import spacing, stored
from lmperf.errors import SpecError
from lmperf.validate import finite_number

NAME = "accumulate"
SUMMARY = "add x to s n times in fp32/fp16/bf16 and mixed: error, and the value where s stalls"

MAX_N = 1_000_000  # a Python loop of scalar ops: beyond this a run takes minutes, not seconds


@dataclass(frozen=True)
class Case:
    """One accumulation: accumulator dtype, addend dtype, and whether the addend is cast first."""

    label: str
    acc: torch.dtype
    addend: torch.dtype
    cast: bool = False  # True: s + x.to(acc); False: s + x, leaving the promotion to torch


CASES: tuple[Case, ...] = (
    Case("fp32 += fp32", torch.float32, torch.float32),
    Case("fp16 += fp16", torch.float16, torch.float16),
    Case("fp32 += fp16 (promoted)", torch.float32, torch.float16),
    Case("fp32 += fp16.to(fp32)", torch.float32, torch.float16, cast=True),
    Case("bf16 += bf16", torch.bfloat16, torch.bfloat16),
    Case("fp32 += bf16 (promoted)", torch.float32, torch.bfloat16),
    Case("fp32 += bf16.to(fp32)", torch.float32, torch.bfloat16, cast=True),
)


def naive_history(case: Case, n: int, addend: float, device: torch.device) -> list[float]:
    """The accumulator before the first and after each of `n` steps of s = s + x (n + 1 floats).

    s starts at 0 in `case.acc`; x is `addend` rounded to `case.addend`. Both are 0-dim tensors,
    so torch's promotion gives the wider dtype (a 0-dim fp32 plus a 1-element fp16 tensor would
    come out fp16); the dtype of each sum is checked.
    """
    s = torch.zeros((), dtype=case.acc, device=device)
    x = torch.tensor(addend, dtype=torch.float64, device=device).to(case.addend)
    if case.cast:
        x = x.to(case.acc)
    states = [s]
    for _ in range(n):
        s = s + x
        states.append(s)  # kept on the device: one copy to the host at the end, no sync per step
    if s.dtype != case.acc:
        raise RuntimeError(f"{case.label}: the sum came out {s.dtype}, not {case.acc}")
    return torch.stack(states).to(torch.float64).cpu().tolist()


def first_stall(history: list[float]) -> int | None:
    """The first step (1-based) whose add left the accumulator unchanged, or None if none did.

    With the same s and x every later step rounds the same way, so the sum stays there.
    """
    for step in range(1, len(history)):
        if history[step] == history[step - 1]:
            return step
    return None


def _exact_times(n: int, value: float) -> float:
    """n * value computed exactly and rounded once to float64."""
    return float(n * Fraction(value))


def case_row(case: Case, n: int, addend: float, device: torch.device) -> dict:
    """One row of the accumulation table: result, error and where (and why) the sum stalled."""
    history = naive_history(case, n, addend, device)
    stall = first_stall(history)
    x = stored(addend, case.addend, device)
    expected = _exact_times(n, addend)
    row = {
        "case": case.label, "accumulator_dtype": dtype_name(case.acc),
        "addend_dtype": dtype_name(case.addend),
        "n": n, "addend": addend, "addend_stored": x, "expected": expected, "result": history[-1],
        "abs_error": abs(history[-1] - expected), "stall_value": None, "stall_step": None,
        "ulp_at_stall": None, "addend_over_ulp_at_stall": None,
    }
    if stall is not None:
        value = history[stall - 1]
        ulp = spacing(value, case.acc, device, up=x >= 0)
        row.update(stall_value=value, stall_step=stall, ulp_at_stall=ulp,
                   addend_over_ulp_at_stall=abs(x) / ulp)
    return row


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--n, --addend (the main run), --long-n, --long-addend (the longer run)."""
    parser.add_argument("--n", type=int, default=1000, help="additions in the main run (default: 1000)")
    parser.add_argument("--addend", type=float, default=0.01, help="value added each step (default: 0.01)")
    parser.add_argument("--long-n", type=int, default=10000,
                        help="additions in the longer run (default: 10000)")
    parser.add_argument("--long-addend", type=float, default=0.001,
                        help="value added each step of the longer run (default: 0.001)")


def _check(n: int, addend: float, n_flag: str, addend_flag: str) -> float:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise SpecError(f"{n_flag} must be an integer from 1 to {MAX_N}, got {n!r}")
    return finite_number(addend_flag, addend, non_zero=True)


def check(device: torch.device, n: int = 1000, addend: float = 0.01, long_n: int = 10000,
          long_addend: float = 0.001) -> tuple[float, float]:
    """Raise SpecError for a bad option (called before the experiment runs anywhere); return
    the two addends as floats."""
    return _check(n, addend, "--n", "--addend"), _check(long_n, long_addend, "--long-n",
                                                        "--long-addend")


def run(device: torch.device, n: int = 1000, addend: float = 0.01, long_n: int = 10000,
        long_addend: float = 0.001) -> ExperimentResult:
    """Accumulation table for (n, addend) and (long_n, long_addend) over CASES."""
    addend, long_addend = check(device, n, addend, long_n, long_addend)
    rows = [case_row(c, n, addend, device) for c in CASES]
    rows += [case_row(c, long_n, long_addend, device) for c in CASES]
    acc = pd.DataFrame(rows)
    for col in ("stall_value", "stall_step", "ulp_at_stall", "addend_over_ulp_at_stall"):
        acc[col] = pd.Series([r[col] for r in rows], dtype=object)  # None, not NaN: "never stalled"
    params = {"device": str(device), "n": n, "addend": addend, "long_n": long_n, "long_addend": long_addend}
    return ExperimentResult(NAME, params, [("accumulation", acc)], _notes(acc, device))


def _notes(acc: pd.DataFrame, device: torch.device) -> list[str]:
    first = acc[acc["n"] == acc["n"].iloc[0]]
    notes = [  # the answer first: it is the report's headline
        f"{first['n'].iloc[0]} x {first['addend'].iloc[0]:g} summed (exact "
        f"{first['expected'].iloc[0]:g}): " + ", ".join(
            f"{r.case} {float(r.result):.6g}" + (
                f" (stalled at step {r.stall_step})" if r.stall_step is not None else "")
            for r in first.itertuples() if "to(" not in r.case)]
    for r in acc[acc["accumulator_dtype"] == acc["addend_dtype"]].itertuples():
        head = f"{r.case}, {r.n} x {r.addend:g}: {float(r.result)!r} (error {r.abs_error:.6g})"
        if r.stall_value is None:
            dtype = getattr(torch, r.accumulator_dtype)
            ulp = spacing(float(r.result), dtype, device, up=r.addend_stored >= 0)
            notes.append(
                f"{head}; it never stalled: at the result its ulp is {ulp:g} and the stored addend "
                f"{r.addend_stored:.6g} is {abs(r.addend_stored) / ulp:.3f} ulp, so each add is rounded "
                f"to a multiple of the ulp (off by up to half an ulp) and the {r.n} roundings add up.")
        else:
            notes.append(
                f"{head}: the accumulator stopped growing at {float(r.stall_value)!r} (step {r.stall_step}), "
                f"where its ulp is {r.ulp_at_stall:g}; the stored addend {r.addend_stored:.6g} is "
                f"{r.addend_over_ulp_at_stall:.3f} ulp, under the half ulp that round-to-nearest-even "
                f"needs to move s, so s + x rounds back to s.")
    for low in ("float16", "bfloat16"):
        for n in acc["n"].unique():
            mixed = (acc["addend_dtype"] == low) & (acc["accumulator_dtype"] == "float32")
            sub = acc[mixed & (acc["n"] == n)]
            if len(sub) == 2:
                promoted, cast = (float(v) for v in sub["result"])
                same = "bit-identical" if promoted == cast else "different"
                r = sub.iloc[0]
                exact = _exact_times(int(n), r["addend_stored"])
                notes.append(
                    f"fp32 accumulator with {low} addends, n={n}: promoted and explicit cast give "
                    f"{same} results ({promoted!r}, {cast!r}). Of the error {r['abs_error']:.3g}, the "
                    f"addend's rounding accounts for {abs(exact - r['expected']):.3g} "
                    f"({r['addend']:g} stored "
                    f"as {float(r['addend_stored'])!r}, times n exactly: {exact!r}) and the fp32 adds for "
                    f"{abs(promoted - exact):.3g}.")
    return notes
