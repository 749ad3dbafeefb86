"""Counting FLOPs on the built model held shape-only (`measure.flops.meta_view`): the model is
given back exactly as it was (parameters, gradients, buffers, attention kernels), also when the
count raises, and the count equals the one of a fresh model built on the meta device."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from lmperf.measure.flops import count_flops, meta_view
from lmperf.model.transformer import CausalSelfAttention
from lmperf.runtime.precision import get_regime
from lmperf.workload.build import count_on_meta, meta_flops, prepare
from lmperf.workload.spec import RunSpec
from lmperf.workload.steps import NO_OBSERVER

CPU = torch.device("cpu")


def _slots(model: nn.Module) -> dict[str, object]:
    """name -> the tensor object in every parameter and buffer slot (shared ones under each
    name), the gradients and the attention kernels: what a count must give back untouched."""
    slots: dict[str, object] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        slots[name], slots[name + ".grad"] = p, p.grad
    slots.update(model.named_buffers(remove_duplicate=False))
    for name, m in model.named_modules():
        if isinstance(m, CausalSelfAttention):
            slots[name + ".attention"] = m.attention
    return slots


def _assert_given_back(model: nn.Module, before: dict[str, object]) -> None:
    after = _slots(model)
    assert after.keys() == before.keys()
    moved = [name for name in before if after[name] is not before[name]]
    assert not moved, moved
    assert all(t.device == CPU for t in (*model.parameters(), *model.buffers()))


@pytest.mark.parametrize("attention, mode, precision", [
    ("naive", "forward", "fp32"),
    ("sdpa", "forward-backward", "fp32"),
    ("flash-torch", "train-step", "fp32"),
    ("naive", "train-step", "bf16-true"),  # bf16 parameters
    ("sdpa", "forward-backward", "bf16-mixed"),
])
def test_a_run_counts_its_own_model_as_a_fresh_meta_build_and_gets_it_back(attention, mode,
                                                                           precision):
    spec = RunSpec.from_size("tiny", context=16, batch=2, attention=attention, mode=mode,
                             precision=precision)
    prepared = prepare(spec, CPU, get_regime(precision))
    prepared.step(prepared.state, NO_OBSERVER)  # gradients and optimizer state exist
    model = prepared.state.model
    before = _slots(model)
    assert prepared.count_flops()[0] == meta_flops(spec)[0] > 0
    # RoPE's cos/sin tables live in one module shared by every block: functional_call left
    # them on meta (pytorch/pytorch#164759)
    _assert_given_back(model, before)
    prepared.step(prepared.state, NO_OBSERVER)  # and the model still runs on its device


def test_a_user_model_that_cannot_run_on_meta_is_given_back_for_the_real_count():
    spec = RunSpec.from_size("tiny", context=16, batch=2, mode="train-step",
                             model="tests.fixtures.models:data_dependent")
    prepared = prepare(spec, CPU, get_regime("fp32"))
    prepared.step(prepared.state, NO_OBSERVER)
    before = _slots(prepared.state.model)
    with pytest.raises(RuntimeError, match="meta"):
        prepared.count_flops()
    _assert_given_back(prepared.state.model, before)
    # the runner's fallback: a real step on the real tensors (a bigram is a lookup: 0 FLOPs)
    assert count_flops(lambda: prepared.step(prepared.state, NO_OBSERVER))[0] == 0


class Tied(nn.Module):
    """Embedding and output head share one weight (V, C), as GPT-2's do; (B, T) -> (B, T, V)."""

    def __init__(self, vocab: int = 64, width: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids))


def test_tied_weights_stay_tied_on_meta_and_come_back_tied():
    model = Tied()
    weight = model.embed.weight
    with meta_view(model):
        assert model.head.weight is model.embed.weight
        assert model.head.weight.is_meta and model.head.weight.dtype == weight.dtype
        assert isinstance(model.head.weight, nn.Parameter) and model.head.weight.requires_grad
    assert model.head.weight is weight and model.embed.weight is weight
    with torch.device("meta"):
        fresh = Tied()
    counted = count_on_meta(model, "train-step", (2, 8), leave_out_attention=False)[0]
    head = 2 * 2 * 8 * 16 * 64  # 2 B T C V: the head's matmul, forward
    assert counted == count_on_meta(fresh, "train-step", (2, 8), False)[0] == 3 * head
    assert weight.grad is None  # the backward's gradient went to the meta stand-in


def test_the_model_comes_back_when_the_step_raises():
    model = Tied()
    before = _slots(model)
    with pytest.raises(ValueError, match="inside"):
        with meta_view(model):
            raise ValueError("inside the count")
    _assert_given_back(model, before)


@pytest.mark.compile
def test_a_compiled_model_runs_on_after_its_eager_module_was_counted():
    spec = RunSpec.from_size("tiny", context=16, batch=2, mode="train-step")
    prepared = prepare(spec, CPU, get_regime("fp32"))
    compiled = torch.compile(prepared.state.model, backend="eager")  # dynamo only: fast
    prepared.state.model = compiled
    prepared.step(prepared.state, NO_OBSERVER)
    before = _slots(compiled._orig_mod)
    assert prepared.count_flops()[0] == meta_flops(spec)[0]
    _assert_given_back(compiled._orig_mod, before)
    prepared.step(prepared.state, NO_OBSERVER)


def test_the_reference_lm_gets_its_kernels_and_tensors_back_when_the_count_raises(monkeypatch):
    import lmperf.measure.flops as flops

    def failing(fn):  # the step runs on meta with attention left out, then the count fails
        fn()
        raise RuntimeError("counter failed")

    spec = RunSpec.from_size("tiny", context=16, batch=2, attention="sdpa", mode="forward")
    prepared = prepare(spec, CPU, get_regime("fp32"))
    before = _slots(prepared.state.model)
    monkeypatch.setattr(flops, "count_flops", failing)
    with pytest.raises(RuntimeError, match="counter failed"):
        prepared.count_flops()
    _assert_given_back(prepared.state.model, before)
