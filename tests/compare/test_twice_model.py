"""The 2x fixture model (tests.fixtures.models:twice) really does twice the reference's work in
every phase: twice the parameters (the optimizer's work), twice the forward and backward FLOPs."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from lmperf.model.checks import count_params
from lmperf.model.custom import build_model
from lmperf.model.presets import ModelConfig


def _flops(model: torch.nn.Module, ids: torch.Tensor) -> tuple[int, int]:
    """(forward FLOPs, forward + backward FLOPs) of one step on `ids`."""
    with FlopCounterMode(display=False) as fwd:
        logits = model(ids)
    with FlopCounterMode(display=False) as both:
        model(ids).float().sum().backward()
    del logits
    return fwd.get_total_flops(), both.get_total_flops()


def test_twice_does_twice_the_work_of_the_reference():
    config = ModelConfig(vocab_size=256, context_length=16, d_model=32, num_layers=2,
                         num_heads=2, d_ff=64)
    torch.manual_seed(0)
    ref = build_model(config)
    twice = build_model(config, "tests.fixtures.models:twice")
    assert count_params(twice) == 2 * count_params(ref)
    ids = torch.randint(0, config.vocab_size, (2, 16))
    assert twice(ids).shape == ref(ids).shape == (2, 16, config.vocab_size)
    ref_fwd, ref_both = _flops(ref, ids)
    twice_fwd, twice_both = _flops(twice, ids)
    assert twice_fwd == 2 * ref_fwd and twice_both == 2 * ref_both
