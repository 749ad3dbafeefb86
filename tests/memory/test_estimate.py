"""The estimator: exact parameter / gradient / AdamW terms, saved bytes within 10% of measured."""

from __future__ import annotations

import functools
import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from lmperf.workload.spec import RunSpec
from lmperf.errors import SpecError
from lmperf.questions.memory.estimate import estimate, param_count, param_tensors
from lmperf.questions.memory.saved import measure_saved, measure_spec
from lmperf.model import EDITIONS, PRESETS, ModelConfig, TransformerLM, count_params
from lmperf.runtime.precision import autocast, get_regime

TINY = ModelConfig(vocab_size=50, context_length=32, d_model=16, num_layers=2, num_heads=2, d_ff=32)


def config(size: str, context: int) -> ModelConfig:
    p = PRESETS[size]
    return ModelConfig(10_000, context, p.d_model, p.num_layers, p.num_heads, p.d_ff)


@pytest.mark.parametrize("size", list(PRESETS))
def test_parameter_count_is_exact_for_every_preset(size):
    c = config(size, 128)
    with torch.device("meta"):
        model = TransformerLM(**c.as_kwargs())
    assert param_count(c) == count_params(model)
    assert param_tensors(c) == len(list(model.parameters()))
    est = estimate(c, 1, 128)
    assert est.param_bytes == sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.mark.parametrize("precision,dtype", [("fp32", torch.float32), ("bf16-mixed", torch.float32),
                                             ("bf16-true", torch.bfloat16)])
@pytest.mark.parametrize("impl", ["fused", "foreach"])
def test_gradient_and_adamw_terms_are_exact(precision, dtype, impl):
    torch.manual_seed(0)
    model = TransformerLM(**TINY.as_kwargs()).to(dtype)
    ids = torch.randint(0, 50, (2, 8))
    F.cross_entropy(model(ids).flatten(0, 1).float(), ids.flatten()).backward()
    opt = torch.optim.AdamW(model.parameters(), **{impl: True})
    opt.step()
    est = estimate(TINY, 2, 8, precision)
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    state = sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
                if torch.is_tensor(v))
    assert est.grad_bytes == grads
    assert est.optimizer_bytes == state
    assert estimate(TINY, 2, 8, precision, mode="forward-backward").optimizer_bytes == 0
    forward = estimate(TINY, 2, 8, precision, mode="forward")
    assert forward.grad_bytes == forward.activation_bytes == forward.optimizer_bytes == 0


def _spec(size: str, context: int, batch: int = 2, course: str = "2025", **kw) -> RunSpec:
    return RunSpec.from_size(size, course, context=context, batch=batch, **kw)


@functools.lru_cache(maxsize=None)
def _cpu_model(size: str, attention: str) -> TransformerLM:
    """The preset's model on the CPU, storage uninitialised: saved bytes do not depend on the
    values, and initialising micro's 5M parameters would dominate this file's run time."""
    with torch.device("meta"):
        model = TransformerLM(**_spec(size, 96, attention=attention).model_config().as_kwargs())
    return model.to_empty(device="cpu")


def _error(spec: RunSpec, report) -> float:
    est = estimate(spec.model_config(), spec.batch, spec.context, spec.precision,
                   spec.attention)
    measured = report.total() + report.total("weight copy")
    assert est.weight_copy_bytes == report.total("weight copy")
    return abs(est.saved_bytes - measured) / measured


@pytest.mark.parametrize("size", ["tiny", "mini", "micro"])
def test_saved_estimate_within_10_percent_on_the_cpu(size):
    for context, precision, attention in itertools.product((16, 96), ("fp32", "bf16-mixed"),
                                                           ("naive", "sdpa")):
        spec = _spec(size, context, precision=precision, attention=attention)
        ids = torch.randint(0, spec.vocab_size, (spec.batch, context))
        regime = get_regime(precision)
        report = measure_saved(_cpu_model(size, attention), ids, ids.clone(),
                               lambda: autocast(regime, torch.device("cpu")))
        assert _error(spec, report) <= 0.10, (context, precision, attention)


@pytest.mark.parametrize("course, size", [("2025", s) for s in EDITIONS["2025"]]
                         + [("2026", "xl"), ("2026", "leaderboard")])
def test_saved_estimate_within_10_percent_on_meta_for_every_preset(course, size):
    # The meta device gives the CPU's bytes for naive fp32 (test_saved) without the memory.
    for context in (128, 1024):
        spec = _spec(size, context, batch=4, course=course)
        assert _error(spec, measure_spec(spec, torch.device("meta"))) <= 0.10


def test_checkpointed_estimate_and_recompute():
    c = config("mini", 64)  # 4 blocks
    plain = estimate(c, 2, 64)
    for g in (1, 2, 3, 4):
        est = estimate(c, 2, 64, checkpoint_group=g)
        bt_c = 2 * 64 * c.d_model * 4
        assert est.activation_terms["checkpointed group inputs"] == math.ceil(4 / g) * bt_c
        assert est.recompute_bytes == g * plain.block_bytes
        assert est.param_bytes == plain.param_bytes and est.optimizer_bytes == plain.optimizer_bytes
    every = estimate(c, 2, 64, checkpoint_group="every-2")  # blocks 1 and 3 keep their input
    assert every.activation_terms["checkpointed block inputs"] == 2 * 2 * 64 * c.d_model * 4
    assert every.activation_bytes - every.activation_terms["checkpointed block inputs"] == \
        plain.activation_bytes - 2 * plain.block_bytes
    assert every.recompute_bytes == plain.block_bytes


def test_cuda_autocast_keeps_exp_and_sum_in_fp32():
    # CUDA's autocast runs exp and sum in fp32 and the PV matmul saves a bf16 cast of the fp32
    # probabilities: per block (2a + 4) BHT^2 + (a + 4) BHT instead of the CPU's 3a and 2a.
    c, b, t = config("mini", 64), 2, 64
    cpu = estimate(c, b, t, "bf16-mixed", "naive", device="cpu")
    cuda = estimate(c, b, t, "bf16-mixed", "naive", device="cuda")
    bht = b * c.num_heads * t
    assert cuda.block_bytes - cpu.block_bytes == 2 * bht * t + 2 * bht
    for regime, attention in (("fp32", "naive"), ("bf16-mixed", "sdpa"), ("bf16-true", "naive")):
        assert estimate(c, b, t, regime, attention, device="cuda").block_bytes == \
            estimate(c, b, t, regime, attention, device="cpu").block_bytes


@pytest.mark.parametrize("kwargs,match", [
    (dict(checkpoint_group=-1), "unknown checkpointing policy"),
    (dict(checkpoint_group="op"), "no closed form for op"),
])
def test_bad_input(kwargs, match):
    args = dict(config=TINY, batch=2, context=8) | kwargs
    with pytest.raises(SpecError, match=match):
        estimate(**args)
