"""float8 training of the Linear layers (torchao): which layers convert, what is refused and
why, in one line, before anything runs."""

from __future__ import annotations

import pytest
import torch

from lmperf.errors import SpecError
from lmperf.runtime.device import info
from lmperf.workload.spec import RunSpec


def test_float8_trains_beside_a_bf16_regime_only():
    for precision in ("fp32", "fp16-mixed", "bf16-true", "bf16-mixed"):
        if precision.startswith("bf16"):
            assert RunSpec.from_size("tiny", precision=precision, float8="rowwise").float8 == \
                "rowwise"
            continue
        with pytest.raises(SpecError, match="trains beside a bf16 regime"):
            RunSpec.from_size("tiny", precision=precision, float8="rowwise")
    with pytest.raises(SpecError, match="unknown recipe"):
        RunSpec.from_size("tiny", precision="bf16-mixed", float8="mxfp8")


def test_a_gpu_without_fp8_tensor_cores_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(info, "cuda_capability", lambda device: (8, 0))
    monkeypatch.setattr(info, "device_name", lambda device: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(torch.version, "hip", None)
    pytest.importorskip("torchao")
    why = info.float8_unsupported_reason(torch.device("cuda"), "rowwise")
    assert why == ("NVIDIA A100-SXM4-80GB (sm_80) has no FP8 tensor cores (sm_89 and newer: "
                   "Ada, Hopper, Blackwell)")
    monkeypatch.setattr(info, "cuda_capability", lambda device: (9, 0))
    assert info.float8_unsupported_reason(torch.device("cuda"), "rowwise") is None


def test_without_torchao_float8_is_refused_naming_the_extra(monkeypatch):
    import importlib.util

    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torchao" else find(name, *a))
    why = info.float8_unsupported_reason(torch.device("cpu"), "rowwise")
    assert why == "torchao is not installed (pip install 'lmperf[float8]')"


def test_every_linear_but_the_head_converts_and_the_state_dict_stays():
    pytest.importorskip("torchao")
    from lmperf.model.custom import build_model
    from lmperf.model.float8 import convert_float8

    spec = RunSpec.from_size("tiny", precision="bf16-true", float8="rowwise")
    model = build_model(spec.model_config())
    keys = list(model.state_dict())
    assert convert_float8(model, "rowwise") == 7 * spec.num_layers  # q k v out, w1 w2 w3
    assert type(model.lm_head).__name__ == "Linear" and "Float8" in type(
        model.layers[0].ffn.w2).__name__
    assert list(model.state_dict()) == keys
    assert convert_float8(model, "none") == 0
