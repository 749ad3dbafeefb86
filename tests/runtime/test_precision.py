"""Precision regimes: lookup, autocast, GradScaler, TF32 flags, support and slowness checks."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from lmperf.runtime.precision import (REGIMES, autocast, compute_dtype, get_regime, grad_scaler,
                                      matmul_precision, slowness_warning, unsupported_reason)

CPU = torch.device("cpu")
SRC = Path(__file__).resolve().parents[2] / "src"
NAMES = ("fp32", "tf32", "bf16-mixed", "fp16-mixed", "fp16-mixed-noscale", "bf16-true", "fp16-true")
AUTOCAST = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16,
            "fp16-mixed-noscale": torch.float16}


@pytest.fixture
def tf32_flags():
    """Restore the float32 matmul precision and cuDNN TF32 flag after the test (the API lmperf
    uses: mixing in the legacy matmul flag would make torch >= 2.9 refuse to report it)."""
    before = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)
    yield before
    torch.set_float32_matmul_precision(before[0])
    torch.backends.cudnn.allow_tf32 = before[1]


def flags() -> tuple[bool, bool]:
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


def test_regime_names():
    assert set(REGIMES) == set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_every_regime_resolves(name):
    r = get_regime(name)
    assert r.name == name
    assert r is REGIMES[name]
    assert r.summary


def test_regime_fields():
    assert get_regime("fp32").param_dtype == torch.float32 and not get_regime("fp32").tf32
    assert get_regime("tf32").tf32 and get_regime("tf32").autocast_dtype is None
    assert get_regime("bf16-true").param_dtype == torch.bfloat16
    assert get_regime("fp16-true").param_dtype == torch.float16
    for name in AUTOCAST:
        assert get_regime(name).param_dtype == torch.float32
    assert [n for n in NAMES if get_regime(n).loss_scaling] == ["fp16-mixed"]
    assert [n for n in NAMES if get_regime(n).tf32] == ["tf32"]


@pytest.mark.parametrize("name,dtype", [
    ("fp32", torch.float32), ("tf32", torch.float32), ("bf16-mixed", torch.bfloat16),
    ("fp16-mixed", torch.float16), ("fp16-mixed-noscale", torch.float16),
    ("bf16-true", torch.bfloat16), ("fp16-true", torch.float16),
])
def test_compute_dtype(name, dtype):
    assert compute_dtype(get_regime(name)) == dtype


@pytest.mark.parametrize("bad", ["FP32", "bf16", "fp16", "", "float32"])
def test_get_regime_unknown(bad):
    with pytest.raises(ValueError, match="unknown precision") as info:
        get_regime(bad)
    for name in NAMES:
        assert name in str(info.value)


@pytest.mark.parametrize("name", ["fp32", "tf32", "bf16-true", "fp16-true"])
def test_autocast_is_a_no_op_without_autocast_dtype(name):
    assert not torch.is_autocast_enabled("cpu")
    a = torch.randn(4, 4)
    with autocast(get_regime(name), CPU):
        assert not torch.is_autocast_enabled("cpu")
        assert (a @ a).dtype == torch.float32
    assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("name", sorted(AUTOCAST))
def test_autocast_enabled_with_dtype(name):
    dtype_before = torch.get_autocast_dtype("cpu")
    a = torch.randn(4, 4)
    with autocast(get_regime(name), CPU):
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == AUTOCAST[name]
        assert (a @ a).dtype == AUTOCAST[name]
    assert not torch.is_autocast_enabled("cpu")
    assert torch.get_autocast_dtype("cpu") == dtype_before


@pytest.mark.parametrize("name", NAMES)
def test_grad_scaler_enabled_only_for_fp16_mixed(name):
    scaler = grad_scaler(get_regime(name), CPU)
    assert isinstance(scaler, torch.amp.GradScaler)
    assert scaler.is_enabled() == (name == "fp16-mixed")


def test_disabled_grad_scaler_passes_the_loss_through():
    loss = torch.tensor(3.0)
    assert grad_scaler(get_regime("fp32"), CPU).scale(loss) is loss
    scaled = grad_scaler(get_regime("fp16-mixed"), CPU).scale(loss)
    assert scaled.item() > loss.item()


def test_tf32_regime_sets_and_restores_flags(tf32_flags):
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    with matmul_precision(get_regime("tf32")):
        assert flags() == (True, True)
    assert flags() == (False, False)


def test_fp32_regime_clears_and_restores_flags(tf32_flags):
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = True
    with matmul_precision(get_regime("fp32")):
        assert flags() == (False, False)
    assert flags() == (True, True)


def test_restores_mixed_flags(tf32_flags):
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = True
    with matmul_precision(get_regime("tf32")):
        assert flags() == (True, True)
    assert flags() == (False, True)


def test_flags_restored_on_exception(tf32_flags):
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    with pytest.raises(KeyError, match="inside"):
        with matmul_precision(get_regime("tf32")):
            assert flags() == (True, True)
            raise KeyError("inside")
    assert flags() == (False, False)


def test_unsupported_reason_on_cpu():
    reason = unsupported_reason(get_regime("tf32"), CPU)
    assert isinstance(reason, str) and "tf32" in reason.lower()
    for name in ("fp32", "bf16-mixed", "bf16-true", "fp16-mixed", "fp16-mixed-noscale", "fp16-true"):
        assert unsupported_reason(get_regime(name), CPU) is None, name


@pytest.mark.parametrize("name", ["fp16-mixed", "fp16-mixed-noscale", "fp16-true"])
def test_slowness_warning_for_fp16_on_cpu(name):
    w = slowness_warning(get_regime(name), CPU)
    assert isinstance(w, str) and name in w
    assert slowness_warning(get_regime(name), torch.device("cuda")) is None  # no GPU needed


@pytest.mark.parametrize("name", ["fp32", "tf32", "bf16-mixed", "bf16-true"])
def test_no_slowness_warning_without_fp16(name, monkeypatch, tmp_path):
    from tests.fixtures.lowp import SAPPHIRE_RAPIDS, simulate_cpu

    simulate_cpu(monkeypatch, tmp_path, SAPPHIRE_RAPIDS)  # bf16 native (else: tests/runtime/test_lowp)
    assert slowness_warning(get_regime(name), CPU) is None


def _run_python(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               GIT_OPTIONAL_LOCKS="0")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, timeout=120)


def test_tf32_state_readable_after_user_sets_matmul_precision():
    # In a child process: this changes process-wide torch settings that cannot be reset exactly.
    proc = _run_python("""
        import torch
        from lmperf.runtime import device as dev, env
        from lmperf.runtime.precision import get_regime, matmul_precision
        with matmul_precision(get_regime("fp32")):
            torch.set_float32_matmul_precision("high")  # what a user's factory may do
        dev.tf32_state()
        env.capture(torch.device("cpu"))
        print("OK")
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "OK" in proc.stdout
