"""Loss faults the train tests inject through `StepState.fault` (lmperf.questions.train.state)."""

from __future__ import annotations

import torch

from lmperf.questions.train.state import LossFault


def nan_loss_at(at_step: int) -> LossFault:
    """A fault that turns the loss into NaN at step `at_step` (1-based), for tests of the stop."""
    def fault(step: int, loss: torch.Tensor) -> torch.Tensor:
        return loss * float("nan") if step == at_step else loss
    return fault
