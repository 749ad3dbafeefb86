"""Weight-update stagnation: w <- w - delta in fp16, bf16, fp32, and low precision with an fp32 master copy.

An update changes a stored weight only if it is more than half the gap to the neighbouring value
in its direction (round to nearest, ties to even). Below that the subtraction rounds back to w and
the step is lost; an fp32 master copy keeps the small steps and the low-precision copy follows it.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import pandas as pd
import torch

from lmperf.questions.amp.base import ExperimentResult, dtype_name
from lmperf.questions.amp.formats import spacing
from lmperf.errors import SpecError
from lmperf.validate import finite_number

NAME = "stagnation"
SUMMARY = "w <- w - delta in fp16/bf16/fp32 and with an fp32 master: how many updates actually change w"

MAX_STEPS = 1_000_000  # a Python loop of scalar ops


@dataclass(frozen=True)
class Regime:
    """Where the weight lives: `storage` is the dtype used (read) each step; `master`: the update
    is applied to an fp32 copy, which is cast down to `storage` after every step."""

    name: str
    storage: torch.dtype
    master: bool = False


REGIMES: tuple[Regime, ...] = (
    Regime("fp16", torch.float16),
    Regime("bf16", torch.bfloat16),
    Regime("fp32", torch.float32),
    Regime("bf16 + fp32 master", torch.bfloat16, master=True),
    Regime("fp16 + fp32 master", torch.float16, master=True),
)


def descend(regime: Regime, w0: float, delta: float, steps: int,
            device: torch.device) -> tuple[list[float], float | None]:
    """Apply w <- w - delta `steps` times on `device`.

    Returns the stored weight before the first and after every step (steps + 1 floats), and the
    fp32 master's final value (None without a master). Without a master, w and delta are both
    rounded to `regime.storage` and the subtraction happens there.
    """
    upd = torch.float32 if regime.master else regime.storage
    w = torch.tensor(w0, dtype=torch.float64, device=device).to(upd)
    d = torch.tensor(delta, dtype=torch.float64, device=device).to(upd)
    states = [w.to(regime.storage)]
    for _ in range(steps):
        w = w - d
        states.append(w.to(regime.storage))  # the copy the model would read; a no-op cast without master
    history = torch.stack(states).to(torch.float64).cpu().tolist()  # one transfer, after the loop
    return history, (w.item() if regime.master else None)


def regime_row(regime: Regime, w0: float, delta: float, steps: int, device: torch.device) -> dict:
    """One row of the stagnation table: how often w moved, where it ended, and the spacing at w0.

    `gap_toward_update` is the distance from w0 to its neighbour in the direction of the update
    (below w0 for a positive delta); at a power of two it is half the ulp above. w moves on the
    first step only if |delta| exceeds half of it.
    """
    history, master = descend(regime, w0, delta, steps, device)
    changed = sum(a != b for a, b in zip(history, history[1:]))  # steps that moved stored w
    expected = w0 - steps * delta  # float64, as if no step were lost
    ulp = spacing(w0, regime.storage, device, up=True)
    gap = spacing(w0, regime.storage, device, up=delta < 0)
    return {
        "regime": regime.name, "storage_dtype": dtype_name(regime.storage),
        "update_dtype": "float32" if regime.master else dtype_name(regime.storage), "steps": steps,
        "steps_that_changed_w": changed, "final_w": history[-1], "final_master": master,
        "expected_w": expected, "abs_error": abs(history[-1] - expected),
        "master_abs_error": abs(master - expected) if master is not None else None,
        "ulp_at_w0": ulp, "gap_toward_update": gap,
        "delta_over_half_ulp": abs(delta) / (ulp / 2), "delta_over_half_gap": abs(delta) / (gap / 2),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--w0, --delta, --steps."""
    parser.add_argument("--w0", type=float, default=1.0, help="starting weight (default: 1.0)")
    parser.add_argument("--delta", type=float, default=1e-4,
                        help="subtracted from w each step (default: 1e-4)")
    parser.add_argument("--steps", type=int, default=1000, help="number of updates (default: 1000)")


def check(device: torch.device, w0: float = 1.0, delta: float = 1e-4,
          steps: int = 1000) -> tuple[float, float]:
    """Raise SpecError for a bad option (called before the experiment runs anywhere); return
    w0 and delta as floats."""
    fp16_max = torch.finfo(torch.float16).max
    if not isinstance(w0, (int, float)) or not math.isfinite(w0) or abs(w0) > fp16_max:
        raise SpecError(f"--w0 must be finite and within fp16's range (|w0| <= {fp16_max:g}), got {w0!r}")
    delta = finite_number("--delta", delta, non_zero=True)
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        raise SpecError(f"--steps must be an integer from 1 to {MAX_STEPS}, got {steps!r}")
    return float(w0), delta


def run(device: torch.device, w0: float = 1.0, delta: float = 1e-4, steps: int = 1000) -> ExperimentResult:
    """The stagnation table over REGIMES."""
    w0, delta = check(device, w0, delta, steps)
    rows = [regime_row(r, w0, delta, steps, device) for r in REGIMES]
    table = pd.DataFrame(rows)
    for col in ("final_master", "master_abs_error"):
        table[col] = pd.Series([r[col] for r in rows], dtype=object)  # None where there is no master
    params = {"device": str(device), "w0": w0, "delta": delta, "steps": steps}
    title = f"w <- w - delta, {steps} steps"
    return ExperimentResult(NAME, params, [(title, table)], _notes(table, w0, delta, device))


def _notes(table: pd.DataFrame, w0: float, delta: float, device: torch.device) -> list[str]:
    notes = [  # the answer first: it is the report's headline
        f"{table['steps'].iloc[0]} updates w <- w - delta changed w in " + ", ".join(
            f"{r.regime} {r.steps_that_changed_w}" for r in table.itertuples()) + " of them."]
    for r in table.itertuples():
        head = (f"{r.regime}: {r.steps_that_changed_w} of {r.steps} steps changed w, final "
                f"{float(r.final_w)!r} vs expected {float(r.expected_w)!r} (error {r.abs_error:.3g})")
        if r.final_master is not None:
            notes.append(f"{head}; the fp32 master ends at {float(r.final_master)!r} (error "
                         f"{r.master_abs_error:.3g}), and the {r.storage_dtype} copy moves each time the "
                         f"master has drifted past half a {r.storage_dtype} gap.")
        elif r.steps_that_changed_w == 0:
            notes.append(
                f"{head}. At w0={w0:g} the {r.storage_dtype} ulp is {r.ulp_at_w0:g} and the gap toward "
                f"the update is {r.gap_toward_update:g}; delta={delta:g} is {r.delta_over_half_gap:.3g} "
                f"of half that gap, so w - delta rounds back to w.")
        else:
            # each move lands on a representable neighbour, so its size is a whole number of gaps
            moved = abs(w0 - r.final_w) / r.steps_that_changed_w
            text = (f"{head}; delta is {r.delta_over_half_gap:.4g} half-gaps at w0 ({r.storage_dtype} gap "
                    f"{r.gap_toward_update:g}) and a changed step moved w by {moved:.4g} on average "
                    f"against delta {delta:g}")
            if r.steps_that_changed_w < r.steps:
                dtype = getattr(torch, r.storage_dtype)
                gap = spacing(float(r.final_w), dtype, device, up=delta < 0)
                text += (f", until w stalled at {float(r.final_w)!r}, where the gap toward the update "
                         f"is {gap:g}")
            notes.append(text + ".")
    return notes
