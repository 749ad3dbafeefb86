"""runtime.lowp and the CPU defaults it decides: native flags, the measured ratio and its cache,
the one-line note when bf16 leaves a default, the warning when it is asked for by name."""

from __future__ import annotations

import json

import pytest
import torch

from lmperf.runtime import lowp
from lmperf.runtime.cache import cache_file
from lmperf.runtime.precision import default_regimes, get_regime, slowness_warning
from tests.fixtures.lowp import AVX2_ONLY, SAPPHIRE_RAPIDS, simulate_cpu

CPU = torch.device("cpu")


def test_flags_are_read_from_the_flags_or_features_line(tmp_path):
    x86, arm = tmp_path / "x86", tmp_path / "arm"
    x86.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\n")
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd asimdhp bf16 i8mm\n")
    assert lowp.cpu_flags(x86) == {"fpu", "avx2", "avx512_bf16"}
    assert {"bf16", "asimdhp"} <= lowp.cpu_flags(arm)
    assert lowp.cpu_flags(tmp_path / "missing") is None


def test_native_flags_per_architecture(monkeypatch):
    monkeypatch.setattr(lowp, "architecture", lambda: "x86")
    assert lowp.native_flags("bf16", frozenset(SAPPHIRE_RAPIDS.split())) == ("avx512_bf16", "amx_bf16")
    assert lowp.native_flags("bf16", frozenset(AVX2_ONLY.split())) == ()
    assert lowp.native_flags("bf16", None) is None
    monkeypatch.setattr(lowp, "architecture", lambda: "arm")
    assert lowp.native_flags("bf16", frozenset({"asimd", "bf16"})) == ("bf16",)


def test_native_cpu_is_trusted_without_measuring(monkeypatch, tmp_path):
    measured = simulate_cpu(monkeypatch, tmp_path, SAPPHIRE_RAPIDS, ratio=50.0)
    support = lowp.cpu_support("bf16")
    assert support.flags == ("avx512_bf16", "amx_bf16") and not support.slow and measured == []


def test_avx2_cpu_measures_once_then_reads_the_cache(monkeypatch, tmp_path):
    measured = simulate_cpu(monkeypatch, tmp_path, AVX2_ONLY, ratio=7.5)
    first, second = lowp.cpu_support("bf16"), lowp.cpu_support("bf16")
    assert measured == ["bf16"]  # the second answer came from the cache
    assert first.slow and first.ratio == second.ratio == 7.5
    assert first.source == "measured now" and second.source.startswith("measured 20")
    cache = json.loads(cache_file(lowp.CACHE).read_text())
    assert [v["ratio"] for v in cache.values()] == [7.5]


def test_a_fast_measurement_keeps_the_dtype_and_a_corrupt_cache_is_measured_again(
        monkeypatch, tmp_path):
    measured = simulate_cpu(monkeypatch, tmp_path, None, ratio=1.2)  # flags unreadable
    cache_file(lowp.CACHE).parent.mkdir(parents=True)
    cache_file(lowp.CACHE).write_text("{not json")
    support = lowp.cpu_support("bf16")
    assert measured == ["bf16"] and support.flags is None and not support.slow


def test_measured_ratio_is_a_real_positive_ratio():
    assert lowp.measure_ratio("bf16", n=32, repeats=2) > 0
    assert torch.get_num_threads() >= 1  # restored after the one-thread measurement


def test_defaults_leave_bf16_out_on_an_avx2_cpu_with_one_note(monkeypatch, tmp_path):
    simulate_cpu(monkeypatch, tmp_path, AVX2_ONLY, ratio=8.0)
    kept, notes = default_regimes(["fp32", "bf16-mixed", "bf16-true"], CPU)
    assert kept == ["fp32"]
    (note,) = notes
    assert note.startswith("bf16-mixed bf16-true left out of the CPU defaults: this CPU has no "
                           "native bf16 (no avx512_bf16/amx_bf16 flag); bf16 matmuls run 8.0x "
                           "slower than fp32 here")
    assert note.endswith("ask for them with --precision bf16-mixed bf16-true")
    assert default_regimes(["fp32", "bf16-mixed"], torch.device("cuda")) == (
        ["fp32", "bf16-mixed"], [])  # GPUs are not second-guessed (no GPU needed)


def test_defaults_keep_bf16_on_a_native_cpu(monkeypatch, tmp_path):
    simulate_cpu(monkeypatch, tmp_path, SAPPHIRE_RAPIDS)
    assert default_regimes(["fp32", "bf16-mixed"], CPU) == (["fp32", "bf16-mixed"], [])


@pytest.mark.parametrize("name", ["bf16-mixed", "bf16-true"])
def test_bf16_asked_for_by_name_warns_like_fp16_on_an_avx2_cpu(name, monkeypatch, tmp_path):
    simulate_cpu(monkeypatch, tmp_path, AVX2_ONLY, ratio=30.0)
    warning = slowness_warning(get_regime(name), CPU)
    assert warning.startswith(f"{name} on this CPU: no native bf16") and "30x slower" in warning
    simulate_cpu(monkeypatch, tmp_path / "native", SAPPHIRE_RAPIDS)
    assert slowness_warning(get_regime(name), CPU) is None
