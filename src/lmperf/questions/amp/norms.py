"""Where LayerNorm and RMSNorm break in fp16 and bf16: x^2 overflow, 1/rms underflow, eps, cancellation.

Each norm is written out op by op in one dtype and compared with fp64 on the exact input; the
method and the columns are in docs/precision-lab.md#norms."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn.functional as F

from lmperf.questions.amp.base import ExperimentResult, dtype_name, finite, max_rel_error, shown
from lmperf.questions.amp.formats import spacing
from lmperf.model.transformer import RMSNorm
from lmperf.runtime import device as dev
from lmperf.errors import SpecError
from lmperf.validate import finite_number, positive_floats, positive_int

NAME = "norms"
SUMMARY = "LayerNorm / RMSNorm in fp16 and bf16: x^2 overflow, 1/rms underflow, eps, small variance"

EPS = 1e-5  # the eps of lmperf's RMSNorm and of F.layer_norm's default
DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
LOW_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)
DEFAULT_SCALES: tuple[float, ...] = (1e-4, 1e-2, 1.0, 1e2, 1e3, 1e4, 6e4)
# From spreads every dtype can hold around an offset of 1e3 (fp16's step there is 0.5, bf16's 4)
# down to ones only fp32 can (its step is 6e-5).
DEFAULT_NOISE_STDS: tuple[float, ...] = (30.0, 1.0, 1e-2, 1e-4)
SEED_EXAMPLE_X = 1e3  # the 1/rms example from the course notes this lab started from
BROKEN_REL_ERROR = 0.1  # a norm whose output is off by 10% of its largest value is no longer a norm


@dataclass
class NormTrace:
    """A norm computed op by op in one dtype, with the intermediates that can fail: `squared`
    (x^2, or (x - mean)^2), `stat` (mean square or variance, (rows, 1)), `stat_plus_eps` and
    `inv` = rsqrt(stat + eps), i.e. 1/rms or 1/std; `out` has the input's shape and dtype."""

    out: torch.Tensor
    squared: torch.Tensor
    stat: torch.Tensor
    stat_plus_eps: torch.Tensor
    inv: torch.Tensor


def _eps_like(x: torch.Tensor, eps: float) -> torch.Tensor:
    # A tensor, not a Python float: a Python scalar would be added at higher precision inside the
    # kernel, hiding what happens to eps when it is stored in the dtype.
    return torch.tensor(eps, dtype=x.dtype, device=x.device)


def rms_norm_explicit(x: torch.Tensor, eps: float = EPS) -> NormTrace:
    """RMSNorm of the last dimension computed entirely in x's dtype (no weight).

    Returns a NormTrace; `out` = x * rsqrt(mean(x^2) + eps).
    """
    squared = x.pow(2)
    stat = squared.mean(-1, keepdim=True)  # (rows, 1)
    stat_plus_eps = stat + _eps_like(x, eps)
    inv = torch.rsqrt(stat_plus_eps)
    return NormTrace(x * inv, squared, stat, stat_plus_eps, inv)


def layer_norm_explicit(x: torch.Tensor, eps: float = EPS, one_pass: bool = False) -> NormTrace:
    """LayerNorm of the last dimension computed entirely in x's dtype (no weight or bias).

    Two-pass (default): var = mean((x - mean)^2). One-pass: var = mean(x^2) - mean^2, the
    textbook shortcut that cancels catastrophically when the mean is large against the spread.
    Returns a NormTrace; `out` = (x - mean) * rsqrt(var + eps).
    """
    mean = x.mean(-1, keepdim=True)  # (rows, 1)
    centered = x - mean
    if one_pass:
        squared = x.pow(2)
        stat = squared.mean(-1, keepdim=True) - mean.pow(2)
    else:
        squared = centered.pow(2)
        stat = squared.mean(-1, keepdim=True)
    stat_plus_eps = stat + _eps_like(x, eps)
    inv = torch.rsqrt(stat_plus_eps)
    return NormTrace(centered * inv, squared, stat, stat_plus_eps, inv)


def rms_norm_fp64(x: torch.Tensor) -> torch.Tensor:
    """The reference RMSNorm: the written-out one in fp64."""
    return rms_norm_explicit(x.double()).out


def layer_norm_fp64(x: torch.Tensor) -> torch.Tensor:
    """The reference LayerNorm (biased variance, two-pass): the written-out one in fp64."""
    return layer_norm_explicit(x.double()).out


def trace_flags(trace: NormTrace) -> dict[str, bool]:
    """The failure flags of one explicit norm: x^2 overflow, 1/rms underflow, eps absorbed."""
    return {
        "x_squared_overflowed": bool(torch.isinf(trace.squared).any().item()),
        # some 1/rms is zero or subnormal in its dtype: its magnitude is lost
        "inv_rms_underflowed": bool((trace.inv.abs() < torch.finfo(trace.inv.dtype).tiny).any()),
        # eps added to the statistic left it unchanged in at least one row
        "eps_absorbed": bool((trace.stat_plus_eps == trace.stat).any().item()),
    }


def _rows(dim: int, rows: int, gen: torch.Generator) -> torch.Tensor:
    """(rows, dim) N(0,1) draws in fp64, each row divided by its max |value| (so max |x| = 1)."""
    z = torch.randn(rows, dim, generator=gen, dtype=torch.float64)
    return z / z.abs().amax(-1, keepdim=True)


def eps_table(eps: float = EPS) -> pd.DataFrame:
    """eps as stored in each dtype: value, relative rounding error, and whether it is subnormal."""
    rows = []
    for dtype in DTYPES:
        stored = torch.tensor(eps, dtype=dtype).item()
        tiny = torch.finfo(dtype).tiny
        rows.append({"dtype": dtype_name(dtype), "eps": eps, "eps_stored": stored,
                     "eps_stored_rel_error": abs(stored - eps) / eps, "smallest_normal": tiny,
                     "eps_subnormal": 0 < stored < tiny})
    return pd.DataFrame(rows)


def seed_example(device: torch.device, x: float = SEED_EXAMPLE_X) -> pd.DataFrame:
    """rsqrt(mean(x^2)) of the one-element row [x] in each dtype, against fp64."""
    expected = 1 / math.sqrt(x * x)
    rows = []
    for dtype in DTYPES:
        t = torch.tensor([x], dtype=dtype, device=device)
        squared = t.pow(2)
        rrms = torch.rsqrt(squared.mean(-1, keepdim=True))
        rows.append({"dtype": dtype_name(dtype), "x": t.item(), "x_squared": squared.item(),
                     "inv_rms": rrms.item(), "inv_rms_fp64": expected,
                     "rel_error": abs(rrms.item() - expected) / expected})
    return pd.DataFrame(rows)


def magnitude_table(device: torch.device, layer: bool, dim: int, rows: int, scales: list[float],
                    seed: int) -> pd.DataFrame:
    """The explicit norm (LayerNorm if `layer`, else RMSNorm) in each dtype, per input magnitude."""
    base = _rows(dim, rows, dev.make_generator(torch.device("cpu"), seed))
    norm, ref_fn = (layer_norm_explicit, layer_norm_fp64) if layer else (rms_norm_explicit, rms_norm_fp64)
    out = []
    for scale in scales:
        x64 = (base * scale).to(device)
        ref = ref_fn(x64)
        for dtype in DTYPES:
            x = x64.to(dtype)
            trace = norm(x)
            out.append({"max_abs_x": scale, "dtype": dtype_name(dtype),
                        "input_overflowed": not finite(x),
                        "input_rounding_rel_error": max_rel_error(ref_fn(x), ref),
                        "finite": finite(trace.out), "max_rel_error": max_rel_error(trace.out, ref),
                        **trace_flags(trace)})
    return pd.DataFrame(out)


def autocast_table(device: torch.device, dim: int, rows: int, scales: list[float],
                   seed: int) -> pd.DataFrame:
    """F.layer_norm and lmperf's RMSNorm under autocast, fed input already in the autocast dtype
    (what a preceding autocast matmul hands them). Reports the dtype autocast returned."""
    base = _rows(dim, rows, dev.make_generator(torch.device("cpu"), seed))
    rms = RMSNorm(dim, eps=EPS).to(device)  # weight = ones: a pure normalisation
    out = []
    for scale in scales:
        x64 = (base * scale).to(device)
        refs = {"F.layer_norm": layer_norm_fp64(x64), "lmperf RMSNorm": rms_norm_fp64(x64)}
        for dtype in LOW_DTYPES:
            x = x64.to(dtype)
            with torch.autocast(device_type=device.type, dtype=dtype), torch.no_grad():
                outs = {"F.layer_norm": F.layer_norm(x, (dim,), eps=EPS), "lmperf RMSNorm": rms(x)}
            for name, y in outs.items():
                out.append({"norm": name, "autocast_dtype": dtype_name(dtype), "max_abs_x": scale,
                            "out_dtype": dtype_name(y.dtype), "finite": finite(y),
                            "max_rel_error": max_rel_error(y, refs[name])})
    return pd.DataFrame(out)


def small_variance_table(device: torch.device, dim: int, rows: int, offset: float,
                         noise_stds: list[float], seed: int) -> pd.DataFrame:
    """LayerNorm of rows offset + std * N(0,1): two-pass, one-pass and F.layer_norm per dtype.

    F.layer_norm runs under autocast for bf16/fp16 (input in that dtype) and plainly for fp32;
    its variance cannot be observed, so its variance columns are NaN / None.
    """
    gen = dev.make_generator(torch.device("cpu"), seed)
    z = torch.randn(rows, dim, generator=gen, dtype=torch.float64)
    out = []
    for std in noise_stds:
        x64 = (offset + std * z).to(device)
        ref = layer_norm_fp64(x64)
        true_var = (x64 - x64.mean(-1, keepdim=True)).pow(2).mean(-1, keepdim=True)
        for dtype in DTYPES:
            x = x64.to(dtype)
            common = {"offset": offset, "noise_std": std, "dtype": dtype_name(dtype),
                      "spacing_at_offset": spacing(offset, dtype, device),
                      "input_rounding_rel_error": max_rel_error(layer_norm_fp64(x), ref)}
            for method, one_pass in (("two-pass", False), ("one-pass", True)):
                trace = layer_norm_explicit(x, one_pass=one_pass)
                var_err = ((trace.stat.double() - true_var).abs() / true_var).max().item()
                out.append({**common, "method": method, "variance_rel_error": var_err,
                            "variance_negative": bool((trace.stat < 0).any().item()),
                            "x_squared_overflowed": trace_flags(trace)["x_squared_overflowed"],
                            "finite": finite(trace.out), "max_rel_error": max_rel_error(trace.out, ref)})
            with torch.autocast(device_type=device.type, dtype=dtype, enabled=dtype != torch.float32):
                y = F.layer_norm(x, (dim,), eps=EPS)
            out.append({**common, "method": "F.layer_norm", "variance_rel_error": math.nan,
                        "variance_negative": None, "x_squared_overflowed": None, "finite": finite(y),
                        "max_rel_error": max_rel_error(y, ref)})
    return pd.DataFrame(out)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The experiment's options (each with a default)."""
    parser.add_argument("--dim", type=int, default=64, help="values per row (default: 64)")
    parser.add_argument("--rows", type=int, default=16, help="rows per input magnitude (default: 16)")
    parser.add_argument("--scales", type=float, nargs="+", default=list(DEFAULT_SCALES), metavar="S",
                        help=f"largest |x| of each input batch (default: {shown(DEFAULT_SCALES)})")
    parser.add_argument("--offset", type=float, default=1e3,
                        help="mean of the small-variance rows (default: 1e3)")
    parser.add_argument("--noise-stds", type=float, nargs="+", default=list(DEFAULT_NOISE_STDS),
                        metavar="STD", help=f"spread of the small-variance rows (default: {shown(DEFAULT_NOISE_STDS)})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random rows (default: 0)")


def check(device: torch.device, dim: int = 64, rows: int = 16, scales: list[float] | None = None,
          offset: float = 1e3, noise_stds: list[float] | None = None,
          seed: int = 0) -> tuple[float, list[float], list[float]]:
    """Raise SpecError for a bad option (called before the experiment runs anywhere); return
    the offset, the scales (ascending) and the noise stds (descending), as floats."""
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 2:
        raise SpecError(f"--dim must be an integer >= 2, got {dim!r}")
    positive_int("--rows", rows)
    offset = finite_number("--offset", offset)
    scales = positive_floats("--scales", DEFAULT_SCALES if scales is None else scales)
    noise_stds = positive_floats("--noise-stds",
                                 DEFAULT_NOISE_STDS if noise_stds is None else noise_stds)
    # Sorted so that "first breaks at" in the notes means the smallest magnitude / largest spread.
    return offset, sorted(scales), sorted(noise_stds, reverse=True)


def run(device: torch.device, dim: int = 64, rows: int = 16, scales: list[float] | None = None,
        offset: float = 1e3, noise_stds: list[float] | None = None, seed: int = 0) -> ExperimentResult:
    """Run the norms experiment on `device`; raises SpecError for a bad option."""
    offset, scales, noise_stds = check(device, dim, rows, scales, offset, noise_stds, seed)
    seed = int(seed)

    seed_df = seed_example(device)
    eps_df = eps_table()
    rms_df = magnitude_table(device, False, dim, rows, scales, seed)
    ln_df = magnitude_table(device, True, dim, rows, scales, seed)
    auto_df = autocast_table(device, dim, rows, scales, seed)
    small_df = small_variance_table(device, dim, rows, offset, noise_stds, seed)
    result = ExperimentResult(
        NAME,
        {"device": device.type, "dim": dim, "rows": rows, "scales": scales, "offset": offset,
         "noise_stds": noise_stds, "seed": seed, "eps": EPS},
        [(f"1/rms of the row [{SEED_EXAMPLE_X:g}]", seed_df),
         ("eps stored in each dtype", eps_df),
         ("RMSNorm written out, per input magnitude", rms_df),
         ("LayerNorm written out, per input magnitude", ln_df),
         ("built-in norms under autocast, per input magnitude", auto_df),
         ("LayerNorm of small-variance rows", small_df)],
    )
    result.notes = _notes(seed_df, eps_df, rms_df, ln_df, auto_df, small_df, device)
    return result



def _broken(row: pd.Series) -> bool:
    return (not row["finite"]) or not (row["max_rel_error"] <= BROKEN_REL_ERROR)


def _notes(seed_df: pd.DataFrame, eps_df: pd.DataFrame, rms_df: pd.DataFrame, ln_df: pd.DataFrame,
           auto_df: pd.DataFrame, small_df: pd.DataFrame, device: torch.device) -> list[str]:
    notes = []
    by = seed_df.set_index("dtype")
    fp16, bf16 = by.loc["float16"], by.loc["bfloat16"]
    notes.append(
        f"x = {SEED_EXAMPLE_X:g}: in float16 x^2 = {fp16['x_squared']:g} and rsqrt(mean(x^2)) = "
        f"{fp16['inv_rms']:g}; in bfloat16 x^2 = {bf16['x_squared']:g} and rsqrt gives "
        f"{bf16['inv_rms']:.6g} (fp64: {fp16['inv_rms_fp64']:g}, relative error "
        f"{bf16['rel_error']:.2%}).")
    for _, r in eps_df[eps_df["eps_subnormal"]].iterrows():
        notes.append(
            f"eps = {r['eps']:g} is stored in {r['dtype']} as {r['eps_stored']:.6g}, a subnormal "
            f"(smallest normal {r['smallest_normal']:.4g}), {r['eps_stored_rel_error']:.2%} off.")
    for label, df in (("RMSNorm", rms_df), ("LayerNorm", ln_df)):
        for dtype, part in df.groupby("dtype", sort=False):
            broken = part[part.apply(_broken, axis=1)]
            if broken.empty:
                notes.append(f"{label} written out in {dtype} held at every magnitude up to "
                             f"{part['max_abs_x'].max():g} (worst error {part['max_rel_error'].max():.2g}).")
                continue
            r = broken.iloc[0]
            why = [w for w, flag in (("x^2 overflowed", r["x_squared_overflowed"]),
                                     ("1/rms underflowed", r["inv_rms_underflowed"]),
                                     ("the input itself overflowed", r["input_overflowed"])) if flag]
            notes.append(
                f"{label} written out in {dtype} first breaks at max|x| = {r['max_abs_x']:g}: "
                f"output {'finite' if r['finite'] else 'not finite'}, error {r['max_rel_error']:.3g}"
                + (f" ({', '.join(why)})." if why else "."))
    for (norm, dtype), part in auto_df.groupby(["norm", "autocast_dtype"], sort=False):
        out_dtypes = ", ".join(part["out_dtype"].unique())
        broken = part[part.apply(_broken, axis=1)]
        tail = ("finite and within "
                f"{part['max_rel_error'].max():.2g} at every magnitude" if broken.empty else
                f"broken from max|x| = {broken['max_abs_x'].iloc[0]:g}")
        notes.append(f"Under autocast({dtype}) on {device.type}, {norm} given {dtype} input returns "
                     f"{out_dtypes}: {tail}.")
    for dtype, part in small_df.groupby("dtype", sort=False):
        kept = part[part["input_rounding_rel_error"] <= BROKEN_REL_ERROR]  # stored input still usable
        per_std = part.drop_duplicates("noise_std")  # the input's rounding is the same for each method
        lost = per_std[per_std["input_rounding_rel_error"] > BROKEN_REL_ERROR]
        first = part.iloc[0]
        text = (f"Small-variance rows (mean {first['offset']:g}) in {dtype}, whose spacing there is "
                f"{first['spacing_at_offset']:.2g}: ")
        if not lost.empty:
            errs = ", ".join(f"{e:.2g}" for e in lost["input_rounding_rel_error"])
            stds = ", ".join(f"{v:g}" for v in lost["noise_std"])
            text += f"storing the input alone puts the output off by {errs} at std {stds}"
            text += ", before any norm runs"
        else:
            text += "the stored input keeps the spread at every std"
        one = kept[(kept["method"] == "one-pass") & kept.apply(_broken, axis=1)]
        if not one.empty:
            r = one.iloc[0]
            why = [w for w, flag in (("x^2 overflowed", r["x_squared_overflowed"]),
                                     ("variance negative", r["variance_negative"])) if flag]
            why = why or [f"variance {r['variance_rel_error']:.3g} off"]
            result = "output not finite" if not r["finite"] else f"error {r['max_rel_error']:.3g}"
            text += (f"; one-pass mean(x^2) - mean^2 breaks already at std {r['noise_std']:g}, where "
                     f"the input is fine ({result}: {', '.join(why)})")
        two = kept[kept["method"] == "two-pass"]
        if not two.empty:
            text += (f"; two-pass stays within {two['max_rel_error'].max():.2g} wherever the input "
                     "survives")
        notes.append(text + ".")
    return notes
