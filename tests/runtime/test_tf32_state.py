"""TF32 state on torch >= 2.9, where a second API (`torch.backends.*.fp32_precision`) sits beside
the legacy one (issue 19, finding 5). Checked against this torch (2.13): once the new API is
used, `torch.get_float32_matmul_precision()` reads stale, and the legacy reads raise when the two
disagree; lmperf records the new API, marks the stale value, and saves/restores both."""

from __future__ import annotations

import pytest
import torch

from lmperf.runtime.device import state
from lmperf.runtime.precision import get_regime, matmul_precision

NEW_API = hasattr(torch.backends.cuda.matmul, "fp32_precision")
needs_new_api = pytest.mark.skipif(not NEW_API, reason="torch < 2.9 has no fp32_precision API")


@pytest.fixture(autouse=True)
def _fresh_precision_state():
    """Put every setting these tests touch back as it was (generic one included)."""
    generic = torch.backends.fp32_precision if NEW_API else None
    saved = state.get_tf32()
    yield
    if NEW_API:
        torch.backends.fp32_precision = generic
    state.restore_tf32(saved)
    assert state.get_tf32() == saved


@needs_new_api
def test_the_new_api_is_recorded_and_the_stale_legacy_value_marked():
    torch.set_float32_matmul_precision("high")
    torch.backends.cuda.matmul.fp32_precision = "ieee"  # what a user or a library may do
    assert torch.get_float32_matmul_precision() == "high"  # the premise: torch reads stale
    got = state.tf32_state()
    assert got["cuda_matmul_fp32_precision"] == "ieee" and got["cuda_matmul_tf32"] is False
    assert str(got["float32_matmul_precision"]).startswith("stale: 'high'")
    assert str(got["cuda_matmul_allow_tf32"]).startswith("unreadable: ")  # the legacy flag raises


@needs_new_api
def test_consistent_settings_read_plainly():
    state.set_tf32(True)
    got = state.tf32_state()
    assert got["float32_matmul_precision"] == "high" and got["cuda_matmul_tf32"] is True
    assert got["cuda_matmul_fp32_precision"] == "tf32" and got["cuda_matmul_allow_tf32"] is True


@needs_new_api
def test_save_and_restore_survive_a_user_who_mixed_the_apis():
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.fp32_precision = "tf32"  # new API only: the legacy getter raises
    with pytest.raises(RuntimeError):
        torch.get_float32_matmul_precision()
    before = state.get_tf32()
    with matmul_precision(get_regime("fp32")):  # what every run does around its steps
        assert state.tf32_state()["cuda_matmul_tf32"] is False
    assert state.get_tf32() == before
    assert state.tf32_state()["cuda_matmul_tf32"] is True  # the user's setting is back


def test_before_torch_2_9_the_legacy_flag_decides():
    with pytest.MonkeyPatch.context() as patch:  # undone before the state is restored
        patch.setattr(state, "_new_api", lambda path: None)
        state.set_tf32(True)
        got = state.tf32_state()
        saved = state.get_tf32()
    assert "cuda_matmul_fp32_precision" not in got
    assert got["cuda_matmul_tf32"] is True and got["float32_matmul_precision"] == "high"
    assert set(saved) == {"float32_matmul_precision", "cudnn_allow_tf32"}
