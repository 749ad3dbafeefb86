"""Gradient accumulation and activation checkpointing inside THE training step: the same
update as one batch of all the rows, recorded in the spec."""

from __future__ import annotations

import pytest
import torch

from lmperf.errors import SpecError
from lmperf.runtime.precision import get_regime
from lmperf.workload.build import prepare
from lmperf.workload.spec import RunSpec
from lmperf.workload.steps import NO_OBSERVER


def _trained(**fields) -> tuple[dict[str, torch.Tensor], tuple[float, float]]:
    spec = RunSpec.from_size("tiny", context=16, device="cpu", optimizer="foreach", **fields)
    run = prepare(spec, torch.device("cpu"), get_regime("fp32"))
    out = run.step(run.state, NO_OBSERVER)
    assert out.loss.dim() == 0
    return ({n: p.detach().clone() for n, p in run.state.model.named_parameters()},
            (out.loss.item(), out.grad_norm.item()))


def test_two_micro_batches_make_the_update_of_their_rows_together() -> None:
    whole, figures = _trained(batch=4)
    accumulated, accumulated_figures = _trained(batch=2, grad_accum=2)  # the same 4 rows
    checkpointed, _ = _trained(batch=2, grad_accum=2, checkpoint=1)
    # AdamW after clipping to 1.0 hides the gradient's scale: the loss and the pre-clip norm
    # show a missing 1 / accum
    assert accumulated_figures == pytest.approx(figures, rel=1e-5)
    for name, p in whole.items():
        # the mean over 4 rows vs the mean of two means of 2: the order of the sums only
        torch.testing.assert_close(accumulated[name], p, rtol=1e-5, atol=1e-6)
        assert torch.equal(checkpointed[name], accumulated[name])  # recompute is exact


def test_the_spec_says_what_ran_and_refuses_what_cannot() -> None:
    spec = RunSpec.from_size("tiny", batch=2, grad_accum=3, checkpoint=2)
    assert spec.to_dict()["grad_accum"] == 3 and spec.to_dict()["checkpoint"] == 2
    assert "x3" in spec.label() and "ckpt=2" in spec.label()
    with pytest.raises(SpecError, match="train-step"):
        RunSpec.from_size("tiny", grad_accum=2, mode="forward-backward")
    with pytest.raises(SpecError):
        RunSpec.from_size("tiny", checkpoint=-1)
