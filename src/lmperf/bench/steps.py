"""The step functions, one per mode, each a dozen visible lines in the right order.

A step reports its phase boundaries to an observer with `start()` and `lap(phase)`: a
`PhaseClock` when timing, a `PeakMemory` probe when measuring memory, `NO_OBSERVER` otherwise.
It also names its ranges through `state.annotate` (step, forward, loss, backward, optimizer):
a no-op when benchmarking, profiler + NVTX ranges when profiling.
The step itself never branches on the precision regime: autocast and the GradScaler are no-ops
when the regime does not use them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, ContextManager, Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F

PHASES: dict[str, tuple[str, ...]] = {
    "forward": ("forward",),
    "forward-backward": ("forward", "backward"),
    "train-step": ("forward", "backward", "optimizer"),
}


class Observer(Protocol):
    """Receives phase boundaries."""

    def start(self) -> None: ...

    def lap(self, phase: str) -> None: ...


class _NoObserver:
    def start(self) -> None:
        pass

    def lap(self, phase: str) -> None:
        pass


NO_OBSERVER = _NoObserver()


@dataclass
class StepState:
    """Everything a step touches, built once per run.

    inputs, targets: token ids (B, T); targets are the next-token labels.
    autocast: a factory for the context that wraps forward and loss (never the optimizer).
    annotate: range name -> context (profiling ranges; a no-op by default).
    """

    model: nn.Module
    inputs: torch.Tensor
    targets: torch.Tensor
    autocast: Callable[[], ContextManager]
    scaler: torch.amp.GradScaler
    optimizer: torch.optim.Optimizer | None = None
    annotate: Callable[[str], ContextManager] = lambda name: contextlib.nullcontext()


def _loss(state: StepState) -> torch.Tensor:
    """Forward + cross-entropy, inside the `forward` range (the `loss` range nested in it)."""
    with state.annotate("forward"), state.autocast():
        logits = state.model(state.inputs)  # (B, T, V)
        with state.annotate("loss"):
            return F.cross_entropy(logits.flatten(0, 1), state.targets.flatten())


def forward_step(state: StepState, obs: Observer) -> None:
    """Inference forward: logits and loss with no autograd graph."""
    obs.start()
    with state.annotate("step"), torch.no_grad():
        _loss(state)
        obs.lap("forward")


def forward_backward_step(state: StepState, obs: Observer) -> None:
    """Forward + loss, then backward; gradients are dropped after the step (untimed)."""
    obs.start()
    with state.annotate("step"):
        loss = _loss(state)
        obs.lap("forward")
        with state.annotate("backward"):
            state.scaler.scale(loss).backward()  # outside autocast: follows forward's dtypes
        obs.lap("backward")
    state.model.zero_grad(set_to_none=True)


def train_step(state: StepState, obs: Observer) -> None:
    """A full training step: forward + loss, scaled backward, AdamW step through the scaler."""
    assert state.optimizer is not None
    obs.start()
    with state.annotate("step"):
        loss = _loss(state)
        obs.lap("forward")
        with state.annotate("backward"):
            state.scaler.scale(loss).backward()
        obs.lap("backward")
        with state.annotate("optimizer"):
            state.scaler.step(state.optimizer)  # unscales; skips the step on inf/NaN grads
            state.scaler.update()  # adjusts the scale (reads found_inf: a sync when enabled)
            state.optimizer.zero_grad(set_to_none=True)
        obs.lap("optimizer")


STEPS: dict[str, Callable[[StepState, Observer], None]] = {
    "forward": forward_step,
    "forward-backward": forward_backward_step,
    "train-step": train_step,
}
