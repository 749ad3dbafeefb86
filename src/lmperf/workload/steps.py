"""The step functions, one per mode, each a dozen visible lines in the right order.

The training step is THE training step of lmperf: `bench --mode train-step`, `profile`, `memory`
and `train` all run this one, in the order that makes mixed precision correct:
autocast(forward, loss) -> scaled backward -> unscale_ -> clip -> scaler.step -> update ->
zero_grad(set_to_none).

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

    inputs, targets: token ids (B, T); targets are the next-token labels (a training loop
        replaces them before each step).
    autocast: a factory for the context that wraps forward and loss (never the optimizer).
    clip: max gradient norm after unscaling (inf: measure the norm, never clip; None: no
        unscale/clip step at all).
    annotate: range name -> context (profiling ranges; a no-op by default).
    fault: (step number, loss) -> loss; tests inject a NaN through it, otherwise the identity.
    accum: micro-batches a train step splits the batch's rows into (gradient accumulation).
    upcast: take the loss on fp32 logits, as torchtitan and `dist train` do (`logits.float()`);
        off in the lab's own steps, where a -true regime's loss in its dtype is part of what it
        shows.
    """

    model: nn.Module
    inputs: torch.Tensor
    targets: torch.Tensor
    autocast: Callable[[], ContextManager]
    scaler: torch.amp.GradScaler
    optimizer: torch.optim.Optimizer | None = None
    clip: float | None = None
    annotate: Callable[[str], ContextManager] = lambda name: contextlib.nullcontext()
    fault: Callable[[int, torch.Tensor], torch.Tensor] = lambda step, loss: loss
    step_number: int = 0  # 1-based number of the step being run (the training loop sets it)
    accum: int = 1
    upcast: bool = False


@dataclass
class StepOutput:
    """What a train step returns, still on the device (reading them is the caller's sync point).

    loss: the unscaled loss (0-dim); grad_norm: the total L2 norm of the gradients after
    unscaling and before clipping (0-dim; inf/NaN when a gradient overflowed), or None when the
    step has no clip step.
    """

    loss: torch.Tensor
    grad_norm: torch.Tensor | None


def _loss(state: StepState, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Forward + cross-entropy, inside the `forward` range (the `loss` range nested in it)."""
    with state.annotate("forward"), state.autocast():
        logits = state.model(inputs)  # (B, T, V)
        with state.annotate("loss"):
            # fp32 under autocast (cross_entropy is on its fp32 list); in the -true regimes it
            # runs in the parameter dtype, which is part of what those regimes show.
            if state.upcast:  # (B, T, V) in fp32: a copy unless it already is
                logits = logits.float()
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
            if state.accum > 1:  # a micro-batch's share: the step's gradient is their mean
                loss = loss / state.accum
    return state.fault(state.step_number, loss)


def forward_step(state: StepState, obs: Observer) -> None:
    """Inference forward: logits and loss with no autograd graph."""
    obs.start()
    with state.annotate("step"), torch.no_grad():
        _loss(state, state.inputs, state.targets)
        obs.lap("forward")


def forward_backward_step(state: StepState, obs: Observer) -> None:
    """Forward + loss, then backward; gradients are dropped after the step (untimed)."""
    obs.start()
    with state.annotate("step"):
        loss = _loss(state, state.inputs, state.targets)
        obs.lap("forward")
        with state.annotate("backward"):
            state.scaler.scale(loss).backward()  # outside autocast: follows forward's dtypes
        obs.lap("backward")
    state.model.zero_grad(set_to_none=True)


def train_step(state: StepState, obs: Observer) -> StepOutput:
    """A full training step: forward + loss, scaled backward (both once per micro-batch: the
    batch's rows in `state.accum` slices, gradients accumulating), unscale + clip, AdamW step
    through the scaler, zero_grad. Returns the loss (the micro-batches' mean) and the pre-clip
    gradient norm (on the device)."""
    assert state.optimizer is not None
    grad_norm = None
    micro = (zip(state.inputs.chunk(state.accum), state.targets.chunk(state.accum))
             if state.accum > 1 else [(state.inputs, state.targets)])
    losses = []
    obs.start()
    with state.annotate("step"):
        for inputs, targets in micro:  # (b, T) token ids each
            losses.append(loss := _loss(state, inputs, targets))
            obs.lap("forward")
            with state.annotate("backward"):
                # Outside autocast: backward runs each op in the dtype its forward used. The
                # scaler multiplies the loss by S (fp16-mixed) so small gradients do not flush
                # to zero.
                state.scaler.scale(loss).backward()
            obs.lap("backward")
        loss = losses[0] if len(losses) == 1 else torch.stack(losses).sum()
        with state.annotate("optimizer"):
            if state.clip is not None:
                state.scaler.unscale_(state.optimizer)  # grads /= S in place; notes inf/NaN
                # Clip the true gradients (after unscaling); the norm returned is pre-clip.
                grad_norm = torch.nn.utils.clip_grad_norm_(state.model.parameters(), state.clip)
            state.scaler.step(state.optimizer)  # unscales if not done; skips on inf/NaN grads
            state.scaler.update()  # adjusts the scale (reads found_inf: a sync when enabled)
            state.optimizer.zero_grad(set_to_none=True)  # no stale grads, no memory held
            out = StepOutput(loss.detach(), None if grad_norm is None else grad_norm.detach())
        obs.lap("optimizer")
    return out


STEPS: dict[str, Callable[[StepState, Observer], None]] = {
    "forward": forward_step,
    "forward-backward": forward_backward_step,
    "train-step": train_step,
}
