"""The dtype trace: its rows agree with what an independent run of the same model shows."""

from __future__ import annotations

import argparse
import inspect

import pytest
import torch
import torch.nn.functional as F

from lmperf.questions.amp import trace
from lmperf.model import VOCAB_SIZE, ModelConfig, PRESETS, TransformerLM
from lmperf.model.transformer import RMSNorm

CPU = torch.device("cpu")
MODULES, GRADS = "module dtypes", "gradient dtypes"


def tiny_lm() -> TransformerLM:
    p = PRESETS["tiny"]
    cfg = ModelConfig(vocab_size=VOCAB_SIZE, context_length=16, d_model=p.d_model,
                      num_layers=p.num_layers, num_heads=p.num_heads, d_ff=p.d_ff)
    return TransformerLM(**cfg.as_kwargs())


def independent_step(param_dtype: torch.dtype, autocast_dtype: torch.dtype | None
                     ) -> tuple[torch.dtype, set[torch.dtype]]:
    """Loss dtype and the set of grad dtypes of one step of the tiny LM, done by hand."""
    model = tiny_lm().to(param_dtype)
    ids = torch.randint(0, VOCAB_SIZE, (2, 16))
    with torch.autocast("cpu", dtype=autocast_dtype or torch.bfloat16,
                        enabled=autocast_dtype is not None):
        loss = F.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
    loss.backward()
    return loss.dtype, {p.grad.dtype for p in model.parameters()}


def name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@pytest.fixture(scope="module")
def bf16_mixed():
    return trace.run(CPU)  # defaults: tiny LM, bf16-mixed


def test_linear_outputs_are_bf16_and_parameters_fp32(bf16_mixed):
    df = bf16_mixed.table(MODULES)
    linear = df[df.module == "Linear"]
    assert len(linear) >= 8  # q, k, v, output, w1, w2, w3 of layers.0, and lm_head
    assert set(linear.output_dtype) == {"bfloat16"}
    modules = df[~df.path.str.startswith("(")]
    assert set(modules.param_dtypes) <= {"float32", "-"}


def test_rmsnorm_returns_its_input_dtype(bf16_mixed):
    df = bf16_mixed.table(MODULES)
    norms = df[df.module == "RMSNorm"]
    assert not norms.empty
    assert (norms.input_dtypes == norms.output_dtype).all()
    # The module really does that, also for a low-precision input under autocast.
    norm = RMSNorm(8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert norm(torch.randn(2, 8, dtype=torch.bfloat16)).dtype == torch.bfloat16
        assert norm(torch.randn(2, 8)).dtype == torch.float32


@pytest.mark.parametrize("precision, param_dtype, autocast_dtype", [
    ("bf16-mixed", torch.float32, torch.bfloat16),
    ("bf16-true", torch.bfloat16, None),
])
def test_loss_and_grads_match_an_independent_step(precision, param_dtype, autocast_dtype):
    res = trace.run(CPU, precision=precision)
    loss_dtype, grad_dtypes = independent_step(param_dtype, autocast_dtype)
    loss = res.table(MODULES).set_index("path").loc["(loss)"]
    assert loss.output_dtype == name(loss_dtype)
    grads = res.table(GRADS)
    assert set(grads.grad_dtype) == {name(d) for d in grad_dtypes}
    assert set(grads.grad_dtype) == {name(param_dtype)}  # float32 for mixed, bf16 for bf16-true
    assert grads.tensors.sum() == len(list(tiny_lm().parameters()))


def test_fold_keeps_layer_zero_and_full_lists_every_layer(bf16_mixed):
    folded = bf16_mixed.table(MODULES)
    full = trace.run(CPU, full=True).table(MODULES)
    assert not folded.path.str.startswith("layers.1.").any()
    layer1 = folded[folded.path == "layers.1"].iloc[0]
    assert "layers.0" in layer1.note
    l0 = full[full.path.str.startswith("layers.0.")]
    l1 = full[full.path.str.startswith("layers.1.")]
    assert len(l0) == len(l1) > 0
    # The shared RoPE module is attributed to the layer that called it, twice (q and k).
    rope = full[full.path == "layers.1.attn.rope"].iloc[0]
    assert rope.calls == 2


def test_fp16_mixed_scales_the_loss():
    res = trace.run(CPU, precision="fp16-mixed", batch=4)
    df = res.table(MODULES).set_index("path")
    assert set(df[df.module == "Linear"].output_dtype) == {"float16"}
    assert "(scaled loss)" in df.index
    assert set(res.table(GRADS).grad_dtype) == {"float32"}


def test_bad_options_raise_value_error():
    for kwargs in ({"precision": "fp8"}, {"size": "huge"},
                   {"context": 0}, {"attention": "flash"}, {"precision": "tf32"}):
        with pytest.raises(ValueError):
            trace.run(CPU, **kwargs)


def test_options_match_run_and_state_is_restored():
    parser = argparse.ArgumentParser()
    trace.add_arguments(parser)
    ns = parser.parse_args(["--precision", "fp32"])
    assert set(vars(ns)) <= set(inspect.signature(trace.run).parameters)
    rng = torch.get_rng_state()
    with torch.no_grad():
        res = trace.run(CPU, **vars(ns))
        assert not torch.is_grad_enabled()
    assert torch.equal(rng, torch.get_rng_state())
    assert torch.get_default_dtype() == torch.float32
    assert set(res.table(GRADS).grad_dtype) == {"float32"}
