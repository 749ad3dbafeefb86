"""Naive vs stable softmax and softplus in fp32, bf16 and fp16: where exp overflows, and how not to.

Each runs entirely in one dtype against fp64 on the same stored logits (method:
docs/precision-lab.md#softmax)."""

from __future__ import annotations

import argparse
import functools
import math
from typing import Callable

import pandas as pd
import torch
import torch.nn.functional as F

from lmperf.questions.amp.base import ExperimentResult, dtype_name, finite, max_rel_error, shown
from lmperf.questions.amp.formats import bits_of, from_bits
from lmperf.runtime import device as dev
from lmperf.errors import SpecError
from lmperf.validate import positive_floats, positive_int

NAME = "softmax"
SUMMARY = "naive vs max-subtracted softmax and naive vs stable softplus; exp overflow; attention logits"

DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
DEFAULT_MAGNITUDES: tuple[float, ...] = (1.0, 10.0, 50.0, 100.0, 500.0, 1e4)
DEFAULT_DIMS: tuple[int, ...] = (16, 64, 128, 256)
ROW = 8  # logits per row in the magnitude sweep


def naive_softmax(x: torch.Tensor) -> torch.Tensor:
    """exp(x) / sum(exp(x)) over the last dimension, in x's dtype."""
    e = torch.exp(x)
    return e / e.sum(-1, keepdim=True)


def stable_softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension with the row max subtracted first, in x's dtype."""
    e = torch.exp(x - x.amax(-1, keepdim=True))  # every exponent <= 0: no overflow
    return e / e.sum(-1, keepdim=True)


def naive_softplus(x: torch.Tensor) -> torch.Tensor:
    """log(1 + exp(x)), in x's dtype."""
    return torch.log(1 + torch.exp(x))


def stable_softplus(x: torch.Tensor) -> torch.Tensor:
    """max(x, 0) + log1p(exp(-|x|)), in x's dtype: exp only ever sees non-positive arguments."""
    return x.clamp(min=0) + torch.log1p(torch.exp(-x.abs()))


def exp_overflow_threshold(dtype: torch.dtype, device: torch.device) -> tuple[float, float, int]:
    """The largest x of `dtype` whose exp (computed by torch on `device`) is finite.

    Returns (largest x with finite exp, the next representable x (exp is inf), probes used).
    Positive floats ordered by value have increasing bit patterns, so bisection over the
    patterns finds the exact largest x.
    """
    lo = 0  # bits of +0.0: exp(0) = 1 is finite
    hi = bits_of(torch.tensor(math.inf, dtype=dtype))
    probes = 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        probes += 1
        if torch.isfinite(torch.exp(from_bits(mid, dtype, device))).item():
            lo = mid
        else:
            hi = mid
    return from_bits(lo, dtype, device).item(), from_bits(hi, dtype, device).item(), probes


def exp_overflow_table(device: torch.device) -> pd.DataFrame:
    """Per dtype: the bisected exp overflow threshold next to log(largest finite) from finfo."""
    rows = []
    for dtype in (*DTYPES, torch.float64):
        largest, nxt, probes = exp_overflow_threshold(dtype, device)
        exp_at = lambda v: torch.exp(torch.tensor(v, dtype=dtype, device=device)).item()  # noqa: E731
        log_max = math.log(torch.finfo(dtype).max)
        rows.append({"dtype": dtype_name(dtype), "largest_x_exp_finite": largest,
                     "exp_of_largest": exp_at(largest), "next_x": nxt, "exp_of_next": exp_at(nxt),
                     "log_of_max_finite": log_max, "gap_to_log_max": log_max - largest,
                     "probes": probes})
    return pd.DataFrame(rows)


def logit_rows(magnitudes: list[float], seed: int) -> torch.Tensor:
    """(len(magnitudes), ROW) fp64 logits: each row N(0,1) scaled so its max is the magnitude."""
    gen = dev.make_generator(torch.device("cpu"), seed)
    z = torch.randn(len(magnitudes), ROW, generator=gen, dtype=torch.float64)
    # Flip rows whose largest |value| is negative, so that the max logit (what overflows) is
    # +magnitude exactly.
    idx = z.abs().argmax(-1, keepdim=True)
    z = z * torch.sign(z.gather(-1, idx))
    return z / z.amax(-1, keepdim=True) * torch.tensor(magnitudes, dtype=torch.float64)[:, None]


def _max_abs_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    return (y.double() - ref).abs().max().item()


def _methods_table(device: torch.device, magnitudes: list[float], seed: int, magnitude_column: str,
                   reference: Callable[[torch.Tensor], torch.Tensor],
                   methods: dict[str, Callable[[torch.Tensor], torch.Tensor]],
                   error: str) -> pd.DataFrame:
    """One row per logit magnitude x dtype: whether each of `methods`, run in that dtype on the
    row's logits (ROW,), is finite, and its `error` ("max_abs_error" or "max_rel_error") against
    `reference` applied in fp64 to the same logits as stored in that dtype."""
    measure = {"max_abs_error": _max_abs_error, "max_rel_error": max_rel_error}[error]
    logits = logit_rows(magnitudes, seed).to(device)  # (len(magnitudes), ROW) fp64
    rows = []
    for i, magnitude in enumerate(magnitudes):
        for dtype in DTYPES:
            x = logits[i].to(dtype)
            ref = reference(x.double())
            row = {magnitude_column: magnitude, "dtype": dtype_name(dtype)}
            for name, method in methods.items():
                y = method(x)
                row[f"{name}_finite"] = finite(y)
                row[f"{name}_{error}"] = measure(y, ref)
            rows.append(row)
    return pd.DataFrame(rows)


def softmax_table(device: torch.device, magnitudes: list[float], seed: int) -> pd.DataFrame:
    """Naive, max-subtracted and torch.softmax per logit magnitude and dtype (max abs error)."""
    torch_softmax = functools.partial(torch.softmax, dim=-1)
    return _methods_table(device, magnitudes, seed, "max_logit", torch_softmax,
                          {"naive": naive_softmax, "stable": stable_softmax,
                           "torch": torch_softmax}, "max_abs_error")


def softplus_table(device: torch.device, magnitudes: list[float], seed: int) -> pd.DataFrame:
    """Naive, stable and F.softplus per logit magnitude and dtype (max error / max |reference|)."""
    return _methods_table(device, magnitudes, seed, "max_x", stable_softplus,
                          {"naive": naive_softplus, "stable": stable_softplus,
                           "F_softplus": F.softplus}, "max_rel_error")


def attention_table(device: torch.device, dims: list[int], tokens: int, seed: int,
                    fp16_exp_limit: float) -> pd.DataFrame:
    """q, k ~ N(0,1) of shape (tokens, d): the logits q.k before and after 1/sqrt(d), and whether
    softmax of them in fp16 stays finite. `fp16_exp_limit` is the bisected fp16 exp threshold."""
    rows = []
    for d in dims:
        gen = dev.make_generator(torch.device("cpu"), seed + d)  # one stream per d, same every run
        q = torch.randn(tokens, d, generator=gen).to(device)
        k = torch.randn(tokens, d, generator=gen).to(device)
        logits = q @ k.T  # (tokens, tokens), fp32
        scaled = logits / math.sqrt(d)
        rows.append({
            "d": d, "tokens": tokens,
            "max_abs_logit": logits.abs().max().item(),
            "max_abs_logit_scaled": scaled.abs().max().item(),
            "max_logit_above_fp16_exp_limit": logits.max().item() > fp16_exp_limit,
            "naive_fp16_finite": finite(naive_softmax(logits.half())),
            "naive_fp16_scaled_finite": finite(naive_softmax(scaled.half())),
            "stable_fp16_finite": finite(stable_softmax(logits.half())),
        })
    return pd.DataFrame(rows)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The experiment's options (each with a default)."""
    parser.add_argument("--magnitudes", type=float, nargs="+", default=list(DEFAULT_MAGNITUDES),
                        metavar="M", help=f"largest logit of each test row (default: {shown(DEFAULT_MAGNITUDES)})")
    parser.add_argument("--dims", type=int, nargs="+", default=list(DEFAULT_DIMS), metavar="D",
                        help=f"head dimensions of the attention-logit test (default: {shown(DEFAULT_DIMS)})")
    parser.add_argument("--tokens", type=int, default=64,
                        help="queries and keys in the attention-logit test (default: 64)")
    parser.add_argument("--seed", type=int, default=0, help="seed of logits, q and k (default: 0)")


def check(device: torch.device, magnitudes: list[float] | None = None,
          dims: list[int] | None = None, tokens: int = 64,
          seed: int = 0) -> tuple[list[float], list[int]]:
    """Raise SpecError for a bad option (called before the experiment runs anywhere); return
    the magnitudes as floats, ascending ("from magnitude M on" in the notes reads in this
    order), and the dims."""
    magnitudes = positive_floats("--magnitudes",
                                 DEFAULT_MAGNITUDES if magnitudes is None else magnitudes)
    dims = list(DEFAULT_DIMS if dims is None else dims)
    if not dims or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims):
        raise SpecError(f"--dims must be one or more positive integers, got {dims}")
    positive_int("--tokens", tokens)
    return sorted(magnitudes), dims


def run(device: torch.device, magnitudes: list[float] | None = None, dims: list[int] | None = None,
        tokens: int = 64, seed: int = 0) -> ExperimentResult:
    """Run the softmax experiment on `device`; raises SpecError for a bad option."""
    magnitudes, dims = check(device, magnitudes, dims, tokens, seed)
    seed = int(seed)

    exp_df = exp_overflow_table(device)
    fp16_limit = exp_df.set_index("dtype").loc["float16", "largest_x_exp_finite"]
    soft_df = softmax_table(device, magnitudes, seed)
    plus_df = softplus_table(device, magnitudes, seed)
    attn_df = attention_table(device, dims, tokens, seed, fp16_limit)
    result = ExperimentResult(
        NAME,
        {"device": device.type, "magnitudes": magnitudes, "dims": dims, "tokens": tokens,
         "seed": seed, "row_length": ROW},
        [("exp overflow", exp_df), ("softmax per logit magnitude", soft_df),
         ("softplus per input magnitude", plus_df), ("attention logits q.k", attn_df)],
    )
    result.notes = _notes(exp_df, soft_df, plus_df, attn_df)
    return result


def _first_failure(df: pd.DataFrame, key: str, col: str) -> dict[str, float | None]:
    """Per dtype, the first value of `key` at which column `col` (a finite flag) is False."""
    out: dict[str, float | None] = {}
    for dtype, part in df.groupby("dtype", sort=False):
        bad = part[~part[col]]
        out[dtype] = None if bad.empty else bad[key].iloc[0]
    return out


_LABELS = {("softmax", "stable"): "Max-subtracted softmax", ("softmax", "torch"): "torch.softmax",
           ("softplus", "stable"): "Stable softplus", ("softplus", "F_softplus"): "F.softplus"}


def _notes(exp_df: pd.DataFrame, soft_df: pd.DataFrame, plus_df: pd.DataFrame,
           attn_df: pd.DataFrame) -> list[str]:
    # The answer first (the report's headline); the table has each threshold's neighbours.
    notes = ["exp overflows above x = " + ", ".join(
        f"{x:.4g} in {d}" for d, x in zip(exp_df["dtype"], exp_df["largest_x_exp_finite"]))
        + "."]
    for label, df, key, cols in (
            ("softmax", soft_df, "max_logit", ("naive", "stable", "torch")),
            ("softplus", plus_df, "max_x", ("naive", "stable", "F_softplus"))):
        err = "max_abs_error" if label == "softmax" else "max_rel_error"
        first = _first_failure(df, key, "naive_finite")
        parts = [f"{dt} from {v:g}" for dt, v in first.items() if v is not None]
        never = [dt for dt, v in first.items() if v is None]
        text = f"Naive {label} goes non-finite in " + (", ".join(parts) if parts else "no dtype")
        if never:
            text += f" (finite throughout in {', '.join(never)})"
        notes.append(text + ".")
        for name in cols[1:]:
            ok = df[f"{name}_finite"].all()
            worst = df.loc[df[f"{name}_{err}"].idxmax()]
            notes.append(f"{_LABELS[label, name]} is {'finite' if ok else 'NOT finite'} at every "
                         f"magnitude and dtype; worst error {worst[f'{name}_{err}']:.3g} "
                         f"({worst['dtype']}, {key} {worst[key]:g}).")
    over = attn_df[~attn_df["naive_fp16_finite"]]
    if over.empty:
        notes.append("Unscaled attention logits stayed below fp16's exp limit for every d.")
    else:
        notes.append(f"Unscaled q.k logits overflow naive fp16 softmax for d = "
                     f"{', '.join(str(d) for d in over['d'])} (max |q.k| up to "
                     f"{over['max_abs_logit'].max():.3g}); after 1/sqrt(d) the largest is "
                     f"{attn_df['max_abs_logit_scaled'].max():.3g} and naive fp16 softmax is "
                     f"{'finite' if attn_df['naive_fp16_scaled_finite'].all() else 'still not finite'} "
                     f"for every d; max-subtracted fp16 softmax of the unscaled logits is "
                     f"{'finite' if attn_df['stable_fp16_finite'].all() else 'not finite'} for every d.")
    return notes
