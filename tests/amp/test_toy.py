"""The ToyModel answers: each equals what an independent step-by-step probe sees on this CPU."""

from __future__ import annotations

import argparse
import inspect
import math

import pytest
import torch
import torch.nn.functional as F

from lmperf.questions.amp import toy
from lmperf.runtime import device as dev

CPU = torch.device("cpu")
TABLE = "ToyModel dtypes"
LOW = {"fp16": torch.float16, "bf16": torch.bfloat16}


def name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def probe(low: torch.dtype, device: torch.device = CPU) -> dict[str, str]:
    """Run the ToyModel layer by layer under autocast and read every dtype directly."""
    model = toy.ToyModel(16, 4).to(device)
    x, y = torch.randn(8, 16, device=device), torch.randint(0, 4, (8,), device=device)
    with torch.autocast(device.type, dtype=low):
        params = {p.dtype for p in model.parameters()}
        h = model.fc1(x)
        r = model.relu(h)
        n = model.ln(r)
        logits = model.fc2(n)
        loss = F.cross_entropy(logits, y)
    loss.backward()
    grads = {p.grad.dtype for p in model.parameters()}
    assert len(params) == len(grads) == 1
    return {toy.PARAMS_Q: name(params.pop()), toy.FC1_Q: name(h.dtype), toy.RELU_Q: name(r.dtype),
            toy.LN_Q: name(n.dtype), toy.LOGITS_Q: name(logits.dtype), toy.LOSS_Q: name(loss.dtype),
            toy.GRADS_Q: name(grads.pop())}


@pytest.fixture(scope="module")
def result():
    return toy.run(CPU)


@pytest.mark.parametrize("short", ["bf16", "fp16"])
def test_answers_equal_an_independent_probe(result, short):
    df = result.table(TABLE).set_index("question")
    assert list(df.index) == list(toy.QUESTIONS)
    assert df[f"cpu_{short}"].to_dict() == probe(LOW[short])


def test_parameters_stay_fp32_and_grads_are_fp32(result):
    df = result.table(TABLE).set_index("question")
    for short in LOW:
        assert df.at[toy.PARAMS_Q, f"cpu_{short}"] == "float32"
        assert df.at[toy.GRADS_Q, f"cpu_{short}"] == "float32"
        assert df.at[toy.FC1_Q, f"cpu_{short}"] == name(LOW[short])


def test_model_is_the_course_toy_model():
    m = toy.ToyModel(5, 3)
    assert m.fc1.bias is None and m.fc2.bias is None
    assert tuple(m.fc1.weight.shape) == (10, 5) and tuple(m.fc2.weight.shape) == (3, 10)
    assert m.ln.normalized_shape == (10,)
    assert m(torch.randn(2, 5)).shape == (2, 3)


@pytest.mark.skipif(dev.cuda_available(), reason="the documented column appears only without a GPU")
def test_cuda_column_is_documented_and_differences_are_marked(result):
    df = result.table(TABLE).set_index("question")
    assert {"cuda_fp16_documented", "cuda_bf16_documented"} <= set(df.columns)
    assert df.at[toy.LN_Q, "cuda_bf16_documented"] == "float32"  # layer_norm: CUDA's fp32 list
    assert df.at[toy.LOSS_Q, "cuda_fp16_documented"] == "float32"
    assert df.at[toy.FC1_Q, "cuda_fp16_documented"] == "float16"
    for q in df.index:
        differs = any(df.at[q, f"cpu_{s}"] != df.at[q, f"cuda_{s}_documented"] for s in LOW)
        assert df.at[q, "differs_from_cuda"] == differs
    assert any("documented policy, not measured here" in n for n in result.notes)


@pytest.mark.gpu
@pytest.mark.skipif(not dev.cuda_available(), reason="torch sees no CUDA device")
def test_cuda_columns_are_measured(result):
    df = result.table(TABLE).set_index("question")
    for short, low in LOW.items():
        assert df[f"cuda_{short}"].to_dict() == probe(low, torch.device("cuda"))


def test_layer_norm_sensitivity_numbers(result):
    sens = result.table("LayerNorm sensitivity")
    fp16 = sens[sens.dtype == "float16"].set_index("quantity")
    sumsq = fp16.iloc[0]
    assert math.isinf(sumsq.low_value)  # 10 squares of ~300 exceed fp16's 65504
    assert math.isfinite(sumsq.fp32_value) and sumsq.fp32_value > 65504
    bf16 = sens[sens.dtype == "bfloat16"].set_index("quantity")
    assert math.isfinite(bf16.iloc[0].low_value)


def test_bad_options_raise_value_error():
    with pytest.raises(ValueError, match="unknown dtype"):
        toy.run(CPU, dtypes=["fp8"])
    with pytest.raises(ValueError, match="in_features"):
        toy.run(CPU, in_features=0)


def test_options_match_run_and_rng_is_untouched():
    parser = argparse.ArgumentParser()
    toy.add_arguments(parser)
    ns = parser.parse_args(["--dtypes", "bf16", "--in-features", "6"])
    assert set(vars(ns)) <= set(inspect.signature(toy.run).parameters)
    rng = torch.get_rng_state()
    res = toy.run(CPU, **vars(ns))
    assert torch.equal(rng, torch.get_rng_state())
    assert "cpu_fp16" not in res.table(TABLE).columns
