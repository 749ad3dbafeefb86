"""`lmperf amp formats`: the table against hand-derived layouts, decoding against numpy/struct, FTZ, plot."""

from __future__ import annotations

import argparse
import json
import math
import struct
from fractions import Fraction

import numpy as np
import pytest
import torch

from lmperf.questions.amp import formats

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def result():
    return formats.run(CPU, value=0.1)


@pytest.fixture(scope="module")
def rows(result):
    return result.table("formats").set_index("format")


@pytest.fixture(scope="module")
def decoded(result):
    return result.table("decoding 0.1").set_index("format")


def _f32_bits(x: float) -> int:
    return struct.unpack(">I", struct.pack(">f", x))[0]


def test_fp16_row_matches_ieee_half(rows):
    fp16 = rows.loc["fp16"]
    assert (fp16["exponent_bits"], fp16["mantissa_bits"], fp16["sign_bits"]) == (5, 10, 1)
    assert fp16["eps"] == fp16["ulp_at_1"] == 2.0 ** -10
    assert fp16["largest_finite"] == 65504.0 == (2 - 2.0 ** -10) * 2.0 ** 15
    assert fp16["smallest_normal"] == 2.0 ** -14
    assert fp16["smallest_subnormal"] == 2.0 ** -24
    assert fp16["checks"] == "ok"


def test_bf16_and_fp32_rows(rows):
    bf16, fp32 = rows.loc["bf16"], rows.loc["fp32"]
    assert bf16["eps"] == 2.0 ** -7 and (bf16["exponent_bits"], bf16["mantissa_bits"]) == (8, 7)
    assert bf16["smallest_subnormal"] == 2.0 ** -133
    assert fp32["eps"] == 2.0 ** -23 and (fp32["exponent_bits"], fp32["mantissa_bits"]) == (8, 23)
    # the largest float32 is the pattern 0 11111110 111...1
    assert fp32["largest_finite"] == struct.unpack(">f", struct.pack(">I", 0x7F7FFFFF))[0]
    assert fp32["smallest_subnormal"] == struct.unpack(">f", struct.pack(">I", 1))[0] == 2.0 ** -149


def test_tf32_row_is_derived_from_its_layout(rows):
    tf32 = rows.loc["tf32"]
    assert tf32["torch_dtype"] == formats.TF32_LABEL
    assert (tf32["bits"], tf32["exponent_bits"], tf32["mantissa_bits"]) == (19, 8, 10)
    assert tf32["eps"] == 2.0 ** -10
    assert tf32["largest_finite"] == (2 - 2.0 ** -10) * 2.0 ** 127
    assert tf32["largest_finite"] < rows.loc["fp32", "largest_finite"]  # 10 mantissa bits, not 23
    assert tf32["smallest_normal"] == rows.loc["fp32", "smallest_normal"] == 2.0 ** -126
    assert tf32["smallest_subnormal"] == 2.0 ** -136


def test_fp8_rows_present_in_this_torch(rows):
    if hasattr(torch, "float8_e4m3fn"):
        e4m3 = rows.loc["fp8_e4m3fn"]
        # e4m3fn: bias 7, the all-ones exponent is finite, only S.1111.111 is nan -> 1.75 * 2**8
        assert e4m3["largest_finite"] == 448.0 and e4m3["ulp_at_1"] == 2.0 ** -3
        assert e4m3["smallest_subnormal"] == 2.0 ** -9
    if hasattr(torch, "float8_e5m2"):
        e5m2 = rows.loc["fp8_e5m2"]
        assert e5m2["largest_finite"] == 57344.0 and e5m2["smallest_subnormal"] == 2.0 ** -16


def test_finfo_disagreement_is_flagged_not_hidden(rows):
    if "fp8_e5m2fnuz" not in rows.index:
        pytest.skip("no float8_e5m2fnuz in this torch")
    row = rows.loc["fp8_e5m2fnuz"]
    assert row["mantissa_bits"] == 2 and row["ulp_at_1"] == 0.25  # 1.00 -> 1.01 in binary
    finfo_ok = torch.finfo(torch.float8_e5m2fnuz).eps == 0.25
    assert (row["checks"] == "ok") == finfo_ok


def test_decoding_0_1_in_fp16_matches_numpy(decoded):
    fp16 = decoded.loc["fp16"]
    half = np.float16(0.1)
    assert fp16["value_stored"] == float(half)
    assert fp16["bit_pattern"].replace(" ", "") == f"{int(half.view(np.uint16)):016b}"
    assert (fp16["sign"], fp16["biased_exponent"], fp16["exponent"], fp16["bias"]) == (0, 11, -4, 15)
    assert fp16["abs_error"] == abs(float(half) - 0.1)
    assert fp16["decoded_from_fields"] == fp16["value_stored"]


def test_decoding_0_1_in_fp32_bf16_tf32(decoded):
    b32 = _f32_bits(0.1)
    assert decoded.loc["fp32", "bit_pattern"].replace(" ", "") == f"{b32:032b}"
    # bf16 is the top 16 bits of fp32 rounded to nearest even; 0.1's low 16 bits are above half
    low = b32 & 0xFFFF
    top = (b32 >> 16) + (1 if low > 0x8000 or (low == 0x8000 and (b32 >> 16) & 1) else 0)
    assert decoded.loc["bf16", "bit_pattern"].replace(" ", "") == f"{top:016b}"
    assert decoded.loc["bf16", "value_stored"] == struct.unpack(">f", struct.pack(">I", top << 16))[0]
    # 0.1 is a normal number in both: tf32 and fp16 keep the same 11 significant bits
    assert decoded.loc["tf32", "value_stored"] == float(np.float16(0.1))
    assert decoded.loc["tf32", "mantissa_field"] == decoded.loc["fp16", "mantissa_field"]


def test_tf32_rounds_to_nearest_even():
    # 1 + 0.75 * 2**-10 is nearer 1 + 2**-10; 1 + 2**-11 is a tie between 1 (even) and 1 + 2**-10;
    # 1 + 3 * 2**-11 is a tie between 1 + 2**-10 (odd mantissa) and 1 + 2**-9 (even)
    cases = {1 + 0.75 * 2.0 ** -10: 1 + 2.0 ** -10, 1 + 2.0 ** -11: 1.0, 1 + 3 * 2.0 ** -11: 1 + 2.0 ** -9}
    for x, want in cases.items():
        assert formats.decode(x, "tf32", None, CPU)["value_stored"] == want, x


def test_decoding_subnormal_and_negative():
    sub = formats.decode(1e-7, "fp16", torch.float16, CPU)
    assert sub["kind"] == "subnormal" and sub["biased_exponent"] == 0
    assert sub["value_stored"] == float(np.float16(1e-7)) == sub["decoded_from_fields"]
    neg = formats.decode(-2.5, "bf16", torch.bfloat16, CPU)
    assert neg["sign"] == 1 and neg["value_stored"] == -2.5 and neg["exponent"] == 1
    big = formats.decode(1e6, "fp16", torch.float16, CPU)
    assert big["kind"] == "inf" and big["abs_error"] == math.inf


def test_every_decoded_value_matches_its_fields():
    for x in (0.1, 3.14159, -1e-3, 300.0):
        for name, dtype in formats.available_formats():
            row = formats.decode(x, name, dtype, CPU)
            if row["kind"] not in ("nan", "inf"):
                assert row["decoded_from_fields"] == row["value_stored"], (x, name)


def test_spacing_agrees_with_nextafter():
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for x in (1.0, 1024.0, -3.5, 6e-5, 0.0):
            t = torch.tensor(x).to(dtype)
            up = torch.nextafter(t, torch.tensor(math.inf).to(dtype)).item()
            down = torch.nextafter(t, torch.tensor(-math.inf).to(dtype)).item()
            assert formats.neighbour(x, dtype, CPU, up=True) == up, (dtype, x)
            assert formats.neighbour(x, dtype, CPU, up=False) == down, (dtype, x)
    # at a power of two the gap below is half the gap above
    assert formats.spacing(1.0, torch.float16, CPU, up=False) == 2.0 ** -11


def test_ftz_probe_matches_an_independent_probe():
    ftz = formats.ftz_probe(CPU)
    fp32 = ftz[ftz["format"] == "fp32"]
    tiny = np.frombuffer(struct.pack("<I", 1), dtype=np.float32)[0]
    independent = bool(tiny * np.float32(1.0) != 0) and bool(tiny + np.float32(0.0) != 0)
    assert independent  # the CPU keeps subnormals unless someone set FTZ/DAZ
    assert fp32["survives"].tolist() == [independent] * 3
    assert (fp32["expected"].tolist()[:2] == [2.0 ** -149] * 2)


def test_ftz_probe_sees_flush_denormal():
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        ftz = formats.ftz_probe(CPU)
    finally:
        torch.set_flush_denormal(False)
    assert not ftz[ftz["format"] == "fp32"]["survives"].any()


def test_ulp_curve_of_fp16(rows):
    xs, ys = formats.ulp_curve(rows.loc["fp16"])
    assert (xs[0], ys[0]) == (2.0 ** -24, 2.0 ** -24)
    curve = dict(zip(xs, ys))
    assert curve[1.0] == 2.0 ** -10 and curve[1024.0] == 1.0 and xs[-1] == 65504.0


def test_plot_writes_a_png(result, tmp_path):
    path = tmp_path / "formats.png"
    formats.plot(result, path)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_an_fp8_format_the_device_cannot_handle_becomes_a_row(monkeypatch, tmp_path):
    if not hasattr(torch, "float8_e5m2"):
        pytest.skip("no float8_e5m2 in this torch")
    real = formats.layout_of

    def failing(dtype, device):
        if dtype == torch.float8_e5m2:
            raise RuntimeError("\"copy_\" not implemented for 'Float8_e5m2'")
        return real(dtype, device)

    monkeypatch.setattr(formats, "layout_of", failing)
    res = formats.run(CPU, value=0.1)
    row = res.table("formats").set_index("format").loc["fp8_e5m2"]
    assert row["checks"].startswith("not supported on cpu: \"copy_\" not implemented")
    assert res.table("decoding 0.1").set_index("format").loc["fp16", "value_stored"] == float(np.float16(0.1))
    assert any(n.startswith("fp8_e5m2: not supported") for n in res.notes)
    formats.plot(res, tmp_path / "p.png")  # the row without numbers is left out of the plot


def test_arguments_and_defaults():
    parser = argparse.ArgumentParser()
    formats.add_arguments(parser)
    assert vars(parser.parse_args([])) == {"value": None}
    assert parser.parse_args(["--value", "0.1"]).value == 0.1
    res = formats.run(CPU, **vars(parser.parse_args([])))
    assert [t for t, _ in res.tables] == ["formats", "flush-to-zero probe"]
    assert {"fp32", "tf32", "bf16", "fp16"} <= set(res.table("formats")["format"])
    assert res.notes and json.dumps(res.to_dict(), allow_nan=False)
    with pytest.raises(ValueError, match="--value"):
        formats.run(CPU, value=float("nan"))


def test_notes_carry_computed_values(result, rows):
    text = " ".join(result.notes)
    assert repr(float(rows.loc['tf32', 'largest_finite'])) in text
    assert repr(float(Fraction(2) - Fraction(1, 2 ** 10)) * 2.0 ** 127) in text
