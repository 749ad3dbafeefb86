"""Floating formats on this torch: layout, spacing and range, how one value is stored, subnormal survival.

Everything is read from the formats themselves at run time: `torch.finfo` where torch has the
dtype, the bit patterns of values built on the device (the spacing above 1.0 is the value of the
pattern of 1.0 plus one), and for TF32, which torch has no dtype for, the IEEE formulas applied
to its 1 + 8 + 10 bit layout. Where finfo and the bit patterns disagree the table says so.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Callable

import pandas as pd
import torch

from lmperf.core.outcome import first_line
from lmperf.questions.amp.base import ExperimentResult, dtype_name
from lmperf.errors import SpecError

NAME = "formats"
SUMMARY = "floating formats (fp32, tf32, bf16, fp16, fp8): bits, spacing, range, decoding a value, FTZ"

# (table name, torch attribute): the fp8 ones are kept only if this torch has them and finfo works.
_CANDIDATES: tuple[tuple[str, str | None], ...] = (
    ("fp32", "float32"), ("tf32", None), ("bf16", "bfloat16"), ("fp16", "float16"),
    ("fp8_e4m3fn", "float8_e4m3fn"), ("fp8_e5m2", "float8_e5m2"),
    ("fp8_e4m3fnuz", "float8_e4m3fnuz"), ("fp8_e5m2fnuz", "float8_e5m2fnuz"),
    ("fp8_e8m0fnu", "float8_e8m0fnu"),
)
TF32_LABEL = "derived, not a torch dtype"
_INT_OF_WIDTH = {8: torch.int8, 16: torch.int16, 32: torch.int32, 64: torch.int64}


@dataclass(frozen=True)
class Layout:
    """A format's bit layout as read from its patterns: widths, exponent bias, special encodings."""

    bits: int
    sign_bits: int
    exponent_bits: int
    mantissa_bits: int
    bias: int
    has_subnormals: bool


def available_formats() -> list[tuple[str, torch.dtype | None]]:
    """(name, dtype) of the formats this torch can describe; tf32's dtype is None (derived)."""
    found = []
    for name, attr in _CANDIDATES:
        if attr is None:
            found.append((name, None))
            continue
        dtype = getattr(torch, attr, None)
        if dtype is None:
            continue
        try:
            torch.finfo(dtype)
        except (TypeError, RuntimeError):
            continue  # e.g. packed fp4: a dtype without finfo is not a scalar float format here
        found.append((name, dtype))
    return found


def width(dtype: torch.dtype) -> int:
    """Storage width of one element of `dtype`, in bits."""
    return torch.empty((), dtype=dtype).element_size() * 8


def bits_of(x: torch.Tensor) -> int:
    """The bit pattern of the one-element tensor `x`, as an unsigned Python int."""
    n = x.element_size() * 8
    return int(x.reshape(1).view(_INT_OF_WIDTH[n]).item()) & ((1 << n) - 1)


def from_bits(pattern: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The 0-dim tensor of `dtype` on `device` whose bit pattern is `pattern` (unsigned int)."""
    n = width(dtype)
    signed = pattern - (1 << n) if pattern >= 1 << (n - 1) else pattern
    return torch.tensor([signed], dtype=_INT_OF_WIDTH[n], device=device).view(dtype)[0]


def stored(x: float, dtype: torch.dtype, device: torch.device) -> float:
    """`x` as `dtype` stores it: a float64 tensor cast to `dtype` on `device` and back to a float."""
    return torch.tensor(x, dtype=torch.float64, device=device).to(dtype).to(torch.float64).item()


def neighbour(x: float, dtype: torch.dtype, device: torch.device, up: bool = True) -> float:
    """The representable `dtype` value next to stored(x) towards +inf (up) or -inf.

    torch.nextafter, which torch implements for fp32, bf16 and fp16 (the formats the
    experiments step through) but not for the fp8 ones.
    """
    t = torch.tensor(x, dtype=torch.float64, device=device).to(dtype)
    return torch.nextafter(t, torch.full_like(t, math.inf if up else -math.inf)).item()


def spacing(x: float, dtype: torch.dtype, device: torch.device, up: bool = True) -> float:
    """Gap in `dtype` between stored(x) and its neighbour towards +inf (up) or -inf; > 0."""
    return abs(neighbour(x, dtype, device, up) - stored(x, dtype, device))


def layout_of(dtype: torch.dtype, device: torch.device) -> Layout:
    """The layout of a torch float dtype, measured from bit patterns on `device`.

    Mantissa bits come from the spacing above 1.0 (one pattern step), the bias from the exponent
    field of 1.0, subnormals from whether pattern 0 is zero and pattern 1 is below the smallest
    normal. finfo.eps is not used here so that `format_row` can check it against this.
    """
    n = width(dtype)
    sign_bits = 1 if torch.finfo(dtype).min < 0 else 0
    one = torch.tensor(1.0, device=device).to(dtype)
    mantissa_bits = -round(math.log2(from_bits(bits_of(one) + 1, dtype, device).item() - 1.0))
    exponent_bits = n - sign_bits - mantissa_bits
    bias = (bits_of(one) >> mantissa_bits) & ((1 << exponent_bits) - 1)
    zero, step = from_bits(0, dtype, device).item(), from_bits(1, dtype, device).item()
    has_sub = zero == 0.0 and 0 < step < torch.finfo(dtype).smallest_normal
    return Layout(n, sign_bits, exponent_bits, mantissa_bits, bias, has_sub)


def tf32_row() -> dict:
    """The TF32 row, derived from its layout (1 sign, 8 exponent, 10 mantissa bits) with the
    IEEE-754 formulas: bias 2**7 - 1, the all-ones exponent reserved for inf/nan.

    TF32 is fp32's range with fp16's mantissa: tensor cores read fp32 registers and use 19 bits.
    """
    mantissa_bits, bias = 10, 2 ** 7 - 1
    eps = 2.0 ** -mantissa_bits  # powers of two: exact in a float
    return {
        "format": "tf32", "torch_dtype": TF32_LABEL, "bits": 19, "sign_bits": 1, "exponent_bits": 8,
        "mantissa_bits": mantissa_bits, "eps": eps, "ulp_at_1": eps,
        "smallest_normal": 2.0 ** (1 - bias),
        "smallest_subnormal": 2.0 ** (1 - bias - mantissa_bits),
        "largest_finite": (2 - eps) * 2.0 ** bias, "decimal_digits": -math.log10(eps),
        "checks": "layout formulas only",
    }


def format_row(name: str, dtype: torch.dtype, device: torch.device) -> dict:
    """One row of the formats table: finfo's values next to what the bit patterns show.

    `checks` is 'ok' or lists each disagreement: finfo.eps vs the spacing above 1.0, and the
    number of normal binades (from finfo's range) vs what the exponent width allows (2**e minus
    the field values reserved for zero/subnormals and inf/nan: between 2**e - 2 and 2**e).
    """
    fi = torch.finfo(dtype)
    lay = layout_of(dtype, device)
    ulp1 = 2.0 ** -lay.mantissa_bits
    problems = []
    if fi.eps != ulp1:
        problems.append(f"finfo.eps {fi.eps:g} != spacing above 1.0 {ulp1:g} "
                        f"({-math.log2(fi.eps):g} vs {lay.mantissa_bits} mantissa bits)")
    binades = math.floor(math.log2(fi.max)) - round(math.log2(fi.smallest_normal)) + 1
    if not 2 ** lay.exponent_bits - 2 <= binades <= 2 ** lay.exponent_bits:
        problems.append(f"{binades} normal binades do not fit {lay.exponent_bits} exponent bits")
    smallest_sub = from_bits(1, dtype, device).item() if lay.has_subnormals else None
    return {
        "format": name, "torch_dtype": dtype_name(dtype), "bits": fi.bits,
        "sign_bits": lay.sign_bits, "exponent_bits": lay.exponent_bits, "mantissa_bits": lay.mantissa_bits,
        "eps": fi.eps, "ulp_at_1": ulp1, "smallest_normal": fi.smallest_normal,
        "smallest_subnormal": smallest_sub, "largest_finite": fi.max,
        "decimal_digits": 0.0 - math.log10(ulp1), "checks": "; ".join(problems) or "ok",
    }


def decode(x: float, name: str, dtype: torch.dtype | None, device: torch.device) -> dict:
    """How format `name` stores `x`: its fields bit by bit, the value read back, the rounding error.

    `dtype` None means tf32: x is cast to fp32 on the device, then its mantissa is rounded to 10
    bits (round to nearest, ties to even) on the integer pattern, the way a conversion to TF32
    keeps the top 19 bits. `decoded_from_fields` rebuilds the value from the fields with exact
    arithmetic; it must equal `value_stored` (torch's own reading of the pattern).
    """
    if dtype is None:
        p32 = bits_of(torch.tensor(x, dtype=torch.float64, device=device).to(torch.float32))
        if (p32 >> 23) & 0xFF != 0xFF:  # inf/nan keep their pattern; others round at bit 13
            p32 = (p32 + 0xFFF + ((p32 >> 13) & 1)) & ~0x1FFF & 0xFFFFFFFF
        value = from_bits(p32, torch.float32, device).item()
        pattern, lay = p32 >> 13, Layout(19, 1, 8, 10, 127, True)
    else:
        t = torch.tensor(x, dtype=torch.float64, device=device).to(dtype)
        value, pattern, lay = t.to(torch.float64).item(), bits_of(t), layout_of(dtype, device)
    m_mask, e_mask = (1 << lay.mantissa_bits) - 1, (1 << lay.exponent_bits) - 1
    mant = pattern & m_mask
    biased = (pattern >> lay.mantissa_bits) & e_mask
    sign = (pattern >> (lay.bits - 1)) & 1 if lay.sign_bits else 0
    if math.isnan(value) or math.isinf(value):
        kind, exponent, rebuilt = ("nan" if math.isnan(value) else "inf"), None, value
    elif value == 0:
        kind, exponent, rebuilt = "zero", None, -0.0 if sign else 0.0
    else:
        subnormal = biased == 0 and lay.has_subnormals
        kind = "subnormal" if subnormal else "normal"
        exponent = 1 - lay.bias if subnormal else biased - lay.bias
        significand = Fraction(mant, 1 << lay.mantissa_bits) + (0 if subnormal else 1)
        rebuilt = float((-1) ** sign * significand * Fraction(2) ** exponent)
    field = "{:0%db}" % lay.exponent_bits
    mfield = ("{:0%db}" % lay.mantissa_bits).format(mant) if lay.mantissa_bits else ""
    abs_err = 0.0 if value == x else (abs(value - x) if math.isfinite(value) else math.inf)
    return {
        "format": name, "input": x, "bit_pattern": " ".join(filter(None, (
            str(sign) if lay.sign_bits else "", field.format(biased), mfield))),
        "sign": sign, "exponent_field": field.format(biased), "biased_exponent": biased, "bias": lay.bias,
        "exponent": exponent, "mantissa_field": mfield, "kind": kind, "value_stored": value,
        "decoded_from_fields": rebuilt, "abs_error": abs_err,
        "rel_error": abs_err / abs(x) if x != 0 else (0.0 if abs_err == 0 else math.inf),
    }


def ftz_probe(device: torch.device) -> pd.DataFrame:
    """Do subnormals survive arithmetic on `device`? One row per (format, probe).

    The smallest subnormal is built from its bit pattern (no arithmetic), then multiplied by 1,
    has 0 added, and the smallest normal is halved; flush-to-zero (FTZ) or denormals-are-zero
    (DAZ) hardware modes would turn each result into 0. `survives`: the result equals the exact
    expected value.
    """
    rows = []
    for name, dtype in (("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)):
        tiny = from_bits(1, dtype, device)
        normal = torch.tensor(torch.finfo(dtype).smallest_normal, device=device).to(dtype)
        probes = (
            ("smallest_subnormal * 1", tiny * torch.ones((), dtype=dtype, device=device), tiny.item()),
            ("smallest_subnormal + 0", tiny + torch.zeros((), dtype=dtype, device=device), tiny.item()),
            ("smallest_normal / 2", normal / 2, torch.finfo(dtype).smallest_normal / 2),
        )
        for probe, result, expected in probes:
            got = result.item()
            rows.append({"format": name, "probe": probe, "expected": expected, "result": got,
                         "survives": got == expected and got != 0})
    return pd.DataFrame(rows)


def _guarded(fn: Callable[[str, torch.dtype | None, torch.device], dict], name: str,
             dtype: torch.dtype | None, device: torch.device) -> dict:
    """fn(name, dtype, device), except that an fp8 dtype this device cannot handle (casts, views,
    reads) becomes a row saying so instead of failing the whole experiment."""
    try:
        return fn(name, dtype, device)
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        if not name.startswith("fp8"):
            raise
        return {"format": name, "torch_dtype": dtype_name(dtype),
                "checks": f"not supported on {device.type}: {first_line(exc)[:120]}"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--value: a number to decode in every format (default: none, no decoding table)."""
    parser.add_argument("--value", type=float, default=None, metavar="X",
                        help="decode X in every format: fields, value stored, rounding error "
                             "(default: no decoding table)")


def check(device: torch.device, value: float | None = None) -> None:
    """Raise SpecError for a bad option (called before the experiment runs anywhere)."""
    if value is not None and (not isinstance(value, (int, float)) or math.isnan(value)):
        raise SpecError(f"--value must be a number (inf allowed, nan not), got {value!r}")


def run(device: torch.device, value: float | None = None) -> ExperimentResult:
    """The formats table, the FTZ probe, and (with `value`) how each format stores that value."""
    check(device, value)
    rows = [tf32_row() if dtype is None else _guarded(format_row, name, dtype, device)
            for name, dtype in available_formats()]
    formats = pd.DataFrame(rows)
    ftz = ftz_probe(device)
    result = ExperimentResult(NAME, {"device": str(device), "value": value},
                              [("formats", formats), ("flush-to-zero probe", ftz)])
    if value is not None:
        dec = pd.DataFrame([_guarded(lambda *a: decode(float(value), *a), name, dtype, device)
                            for name, dtype in available_formats()])
        result.tables.append((f"decoding {value!r}", dec))
    result.notes.extend(_notes(formats, ftz, device, result))
    return result


def _notes(formats: pd.DataFrame, ftz: pd.DataFrame, device: torch.device,
           result: ExperimentResult) -> list[str]:
    by = formats.set_index("format")
    notes = [  # the answer first: it is the report's headline
        f"bf16 keeps fp32's range (largest {by.loc['bf16', 'largest_finite']:.4g} vs "
        f"{by.loc['fp32', 'largest_finite']:.4g}) with a spacing at 1.0 of {by.loc['bf16', 'ulp_at_1']:g}; "
        f"fp16 is {by.loc['bf16', 'ulp_at_1'] / by.loc['fp16', 'ulp_at_1']:g}x finer at 1.0 "
        f"({by.loc['fp16', 'ulp_at_1']:g}) but overflows above {by.loc['fp16', 'largest_finite']:g} "
        f"and its smallest normal is {by.loc['fp16', 'smallest_normal']:.4g}.",
        f"tf32 ({TF32_LABEL}) has fp16's spacing at 1.0 ({by.loc['tf32', 'ulp_at_1']:g}) and fp32's "
        f"exponent range: smallest normal {by.loc['tf32', 'smallest_normal']:.6g} (fp32 "
        f"{by.loc['fp32', 'smallest_normal']:.6g}); its largest finite value "
        f"{float(by.loc['tf32', 'largest_finite'])!r} is fp32's "
        f"{float(by.loc['fp32', 'largest_finite'])!r} with the "
        f"mantissa cut to {by.loc['tf32', 'mantissa_bits']} bits.",
    ]
    for name, row in by.iterrows():
        if str(row["checks"]).startswith("not supported"):
            notes.append(f"{name}: {row['checks']}.")
        elif row["checks"] not in ("ok", "layout formulas only"):
            notes.append(f"{name}: {row['checks']}; the table's mantissa_bits and ulp_at_1 follow the bits.")
    lost = ftz[~ftz["survives"]]
    if lost.empty:
        notes.append(f"On {device.type} every subnormal probe survived ({len(ftz)} probes over "
                     f"{ftz['format'].nunique()} formats): no flush-to-zero on this path.")
    else:
        notes.append(f"On {device.type} these subnormal probes were flushed: "
                     + ", ".join(f"{r.format} {r.probe} -> {r.result:g}" for r in lost.itertuples()) + ".")
    if len(result.tables) > 2:
        dec = result.tables[2][1]
        worst = dec.loc[dec["rel_error"].idxmax()]
        bad = dec[(dec["decoded_from_fields"] != dec["value_stored"]) & dec["value_stored"].notna()
                  & ~dec["kind"].eq("nan")]
        notes.append(f"{float(dec['input'].iloc[0])!r} is stored with the largest relative error in "
                     f"{worst['format']} ({float(worst['value_stored'])!r}, {worst['rel_error']:.3g}); "
                     + ("every value rebuilt from its sign, exponent and mantissa fields matches "
                        "the value torch reads back." if bad.empty else
                        f"fields and stored value disagree for {', '.join(bad['format'])}."))
    return notes


def ulp_curve(row: pd.Series | dict) -> tuple[list[float], list[float]]:
    """Magnitudes and the spacing there, for a formats-table row, from smallest positive to largest.

    Below the smallest normal the spacing is the smallest subnormal; in the binade [2**k, 2**(k+1))
    it is 2**(k - mantissa_bits). Points are binade starts plus the largest finite value, for a
    step plot.
    """
    m = int(row["mantissa_bits"])
    normal, largest = float(row["smallest_normal"]), float(row["largest_finite"])
    sub = row["smallest_subnormal"]
    xs, ys = [], []
    if sub is not None and not (isinstance(sub, float) and math.isnan(sub)):
        xs.append(float(sub))
        ys.append(float(sub))
    k = round(math.log2(normal))
    while 2.0 ** k <= largest:
        xs.append(2.0 ** k)
        ys.append(2.0 ** (k - m))
        k += 1
    xs.append(largest)
    ys.append(ys[-1])
    return xs, ys


def plot(result: ExperimentResult, path: Path) -> None:
    """Spacing (ulp) against magnitude, log-log, for every torch format in the table; PNG."""
    from matplotlib.figure import Figure  # no pyplot: no global figure state, no backend switch

    formats = result.table("formats")
    fig = Figure(figsize=(13, 5.5), layout="tight")
    # left: every finite range; right: the same curves zoomed where fp16 and fp8 live
    axes = fig.subplots(1, 2)
    for ax, zoom in zip(axes, (False, True)):
        for _, row in formats.iterrows():
            if row["torch_dtype"] == TF32_LABEL or pd.isna(row["mantissa_bits"]):
                continue  # tf32: fp32's curve with 13 fewer mantissa bits; NaN: unsupported here
            xs, ys = ulp_curve(row)
            ax.step(xs, ys, where="post", linestyle="-" if row["bits"] >= 16 else ":",
                    label=f"{row['format']} ({int(row['mantissa_bits'])} mantissa bits)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        if zoom:
            ax.set_xlim(2.0 ** -26, 2.0 ** 18)
            ax.set_ylim(2.0 ** -34, 2.0 ** 16)
        ax.set_xlabel("magnitude |x|")
        ax.set_ylabel("spacing to the next value (ulp)")
        ax.set_title("zoom: fp16 and fp8 ranges" if zoom else "each format over its finite range")
        ax.grid(True, which="major", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"ulp against magnitude ({result.params.get('device')})")
    fig.savefig(path, dpi=110)
