"""The autocast policy probe: its table agrees with independent probes, options fail cleanly."""

from __future__ import annotations

import argparse
import inspect

import pytest
import torch
import torch.nn.functional as F

from lmperf.questions.amp import policy
from lmperf.runtime import device as dev

CPU = torch.device("cpu")
LOW = {"fp16": torch.float16, "bf16": torch.bfloat16}
TABLE = "autocast policy"


@pytest.fixture(scope="module")
def result():
    return policy.run(CPU, dtypes=["fp16", "bf16"], ops=["mm", "softmax", "log_softmax",
                                                         "layer_norm", "cross_entropy", "relu"])


def row(df, op: str, low: torch.dtype, input_dtype: torch.dtype):
    sel = df[(df.op == op) & (df.autocast_dtype == str(low).replace("torch.", ""))
             & (df.input_dtype == str(input_dtype).replace("torch.", ""))]
    assert len(sel) == 1, sel
    return sel.iloc[0]


def test_mm_under_bf16_autocast_casts_fp32_inputs_to_bf16(result):
    a, b = torch.randn(4, 8), torch.randn(8, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        direct = torch.mm(a, b).dtype
    assert direct == torch.bfloat16
    r = row(result.table(TABLE), "mm", torch.bfloat16, torch.float32)
    assert r.cpu_output_dtype == "bfloat16"
    assert r.cpu_behaviour == "casts to low"


@pytest.mark.parametrize("name", ["fp16", "bf16"])
@pytest.mark.parametrize("op, fn", [
    ("softmax", lambda x: F.softmax(x, dim=-1)),
    ("layer_norm", lambda x: F.layer_norm(x, (8,))),
    ("cross_entropy", lambda x: F.cross_entropy(x, torch.tensor([0, 1, 2, 3]))),
])
def test_rows_equal_a_direct_measurement(result, name, op, fn):
    low = LOW[name]
    for input_dtype in (torch.float32, low):
        x = torch.randn(4, 8).to(input_dtype)
        with torch.autocast("cpu", dtype=low):
            measured = fn(x).dtype
        r = row(result.table(TABLE), op, low, input_dtype)
        assert r.cpu_output_dtype == str(measured).replace("torch.", "")
        expected = ("keeps input dtype" if measured == input_dtype else
                    "casts to low" if measured == low else "runs in fp32 (upcast)")
        assert r.cpu_behaviour == expected


def test_classify():
    f32, bf = torch.float32, torch.bfloat16
    assert policy.classify(f32, bf, bf) == "casts to low"
    assert policy.classify(bf, f32, bf) == "runs in fp32 (upcast)"
    assert policy.classify(bf, bf, bf) == "keeps input dtype"
    assert policy.classify(f32, f32, bf) == "keeps input dtype"
    assert policy.classify(bf, torch.float16, bf) == "other: float16"


def test_belief_note_is_computed_from_the_table(result):
    df = result.table(TABLE)
    for name, low in LOW.items():
        lowname = str(low).replace("torch.", "")
        kept = set(df[(df.autocast_dtype == lowname) & (df.input_dtype == lowname)
                      & (df.cpu_behaviour == "keeps input dtype")].op)
        believed = sorted(kept & policy.CUDA_DOCUMENTED_FP32)
        notes = [n for n in result.notes if "documented fp32 list" in n and f"({lowname})" in n]
        if believed:
            assert len(notes) == 1
            listed = notes[0].split(" inputs: ")[1].split(". ")[0].split(", ")
            assert sorted(listed) == believed
        else:
            assert not notes


def test_unknown_op_or_dtype_raises_value_error():
    with pytest.raises(ValueError, match="unknown op"):
        policy.run(CPU, ops=["softmax", "not_an_op"])
    with pytest.raises(ValueError, match="unknown dtype"):
        policy.run(CPU, dtypes=["fp8"])


def test_without_cuda_only_cpu_columns(monkeypatch):
    monkeypatch.setattr(dev, "cuda_available", lambda: False)
    res = policy.run(CPU, dtypes=["bf16"], ops=["mm"])
    df = res.table(TABLE)
    assert "differs" not in df.columns
    assert not any(c.startswith("cuda_") for c in df.columns)
    assert any("no CUDA device" in n for n in res.notes)


@pytest.mark.gpu
@pytest.mark.skipif(not dev.cuda_available(), reason="torch sees no CUDA device")
def test_with_cuda_side_by_side():
    res = policy.run(CPU, dtypes=["fp16"], ops=["mm", "softmax"])
    df = res.table(TABLE)
    assert {"cpu_behaviour", "cuda_behaviour", "differs"} <= set(df.columns)
    r = row(df, "softmax", torch.float16, torch.float16)
    assert r.differs == (r.cpu_behaviour != r.cuda_behaviour)


def test_options_match_run_and_restore_state():
    parser = argparse.ArgumentParser()
    policy.add_arguments(parser)
    ns = parser.parse_args(["--dtypes", "bf16", "--ops", "softmax", "dropout"])
    assert set(vars(ns)) <= set(inspect.signature(policy.run).parameters)
    defaults = parser.parse_args([])
    assert defaults.dtypes == ["fp16", "bf16"] and defaults.ops is None
    rng = torch.get_rng_state()
    grad = torch.is_grad_enabled()
    res = policy.run(CPU, **vars(ns))
    assert torch.equal(rng, torch.get_rng_state())  # dropout ran on a forked generator
    assert torch.is_grad_enabled() == grad
    assert not torch.is_autocast_enabled("cpu")
    assert list(res.table(TABLE).op.unique()) == ["softmax", "dropout"]
