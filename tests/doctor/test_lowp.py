"""The doctor's low-precision matmul check: each dtype's time relative to fp32, the native flags,
and the ratios it measures becoming the ones the CPU defaults read."""

from __future__ import annotations

import torch

from lmperf.questions.doctor.checks import Context
from lmperf.questions.doctor.lowp import check_lowp_matmuls
from lmperf.runtime import lowp
from tests.fixtures.lowp import AVX2_ONLY, SAPPHIRE_RAPIDS, simulate_cpu


def test_avx2_cpu_reports_both_dtypes_slow_and_refreshes_the_cache(monkeypatch, tmp_path):
    measured = simulate_cpu(monkeypatch, tmp_path, AVX2_ONLY, ratio=12.0)
    out = check_lowp_matmuls(Context(torch.device("cpu"), tmp_path))
    assert out.status == "ok" and measured == ["bf16", "fp16"]
    assert out.result == ("bf16 12x fp32's time; fp16 12x fp32's time; native: none; bf16, fp16 "
                          "regimes left out of the CPU defaults")
    assert out.values["time_over_fp32"] == {"bf16": 12.0, "fp16": 12.0}
    support = lowp.cpu_support("bf16")  # read back from the cache the check wrote
    assert measured == ["bf16", "fp16"] and support.slow and support.ratio == 12.0


def test_native_cpu_names_its_flags_and_leaves_nothing_out(monkeypatch, tmp_path):
    simulate_cpu(monkeypatch, tmp_path, SAPPHIRE_RAPIDS, ratio=0.5)
    out = check_lowp_matmuls(Context(torch.device("cpu"), tmp_path))
    assert out.result == ("bf16 0.50x fp32's time; fp16 0.50x fp32's time; native: bf16 "
                          "(avx512_bf16/amx_bf16), fp16 (avx512_fp16)")
    assert out.values["left_out_of_cpu_defaults"] == []


def test_real_measurement_on_this_cpu(monkeypatch, tmp_path):
    # at the size the defaults decide from (256): a smaller product is overhead, and a native
    # bf16 (this VM's avx512_bf16: 0.27x fp32's time at 256) measures 4.6x at 32
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    out = check_lowp_matmuls(Context(torch.device("cpu"), tmp_path))
    assert out.status == "ok" and all(r > 0 for r in out.values["time_over_fp32"].values())
