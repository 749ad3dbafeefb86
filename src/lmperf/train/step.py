"""The training step, in one readable function, and what it needs (model, AdamW, GradScaler).

The order is the one that makes mixed precision correct:
zero_grad(set_to_none) -> autocast(forward, loss) -> scaled backward -> unscale_ -> clip ->
scaler.step -> scaler.update. The step never branches on the regime: autocast is a nullcontext
and the GradScaler a pass-through where the regime does not use them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ContextManager

import torch
import torch.nn as nn
import torch.nn.functional as F

from lmperf.model.custom import build_model, count_params
from lmperf.runtime import device as dev
from lmperf.runtime.precision import Regime, autocast, grad_scaler
from lmperf.train.config import TrainConfig

# (step, loss) -> loss. Tests inject faults through it (e.g. a NaN loss at step N); in a normal
# run it is `no_fault`, so production code reads no environment variable and has no test branch.
LossFault = Callable[[int, torch.Tensor], torch.Tensor]


def no_fault(step: int, loss: torch.Tensor) -> torch.Tensor:
    """The identity: the loss as the model computed it."""
    return loss


def nan_loss_at(at_step: int) -> LossFault:
    """A fault that turns the loss into NaN at step `at_step` (1-based), for tests of the stop."""
    def fault(step: int, loss: torch.Tensor) -> torch.Tensor:
        return loss * float("nan") if step == at_step else loss
    return fault


@dataclass
class TrainState:
    """Everything the step touches, built once per regime.

    autocast: a factory for the context around forward + loss (never around the optimiser).
    clip: max gradient norm (inf: measure the norm, never clip).
    fault: see LossFault.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    autocast: Callable[[], ContextManager]
    clip: float
    fault: LossFault = no_fault


@dataclass
class StepOutput:
    """What a step returns, still on the device (reading them is the caller's sync point).

    loss: the unscaled loss (0-dim); grad_norm: total L2 norm of the gradients after unscaling
    and before clipping (0-dim); inf/NaN when a gradient overflowed.
    """

    loss: torch.Tensor
    grad_norm: torch.Tensor


def build_state(cfg: TrainConfig, regime: Regime, device: torch.device,
                fault: LossFault = no_fault) -> tuple[TrainState, int]:
    """(state, parameter count) for one regime, from the run's seed.

    Every regime starts from the same fp32 initial weights (seeded before building), cast to the
    regime's parameter dtype: fp32 for the mixed regimes (fp32 master weights, fp32 AdamW state),
    bf16/fp16 in the -true regimes (weights, gradients and AdamW state all in that dtype).
    """
    dev.seed_all(cfg.seed)
    with torch.device("cpu"):  # built on the CPU: the same initial weights on any device
        model = build_model(cfg.model_config())
    model.to(device=device, dtype=regime.param_dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr_at(1), betas=(cfg.beta1, cfg.beta2),
                                  eps=cfg.eps, weight_decay=cfg.weight_decay)
    state = TrainState(model=model, optimizer=optimizer, scaler=grad_scaler(regime, device),
                       autocast=lambda: autocast(regime, device),
                       clip=cfg.clip if cfg.clip > 0 else float("inf"), fault=fault)
    return state, count_params(model)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set the learning rate of every parameter group (the schedule is the caller's)."""
    for group in optimizer.param_groups:
        group["lr"] = lr


def train_step(s: TrainState, inputs: torch.Tensor, targets: torch.Tensor, step: int) -> StepOutput:
    """One optimiser step on a batch: inputs, targets (B, T) token ids on the model's device."""
    s.optimizer.zero_grad(set_to_none=True)  # no stale gradients, and no memory held for them
    with s.autocast():  # forward and loss only
        logits = s.model(inputs)  # (B, T, V)
        # fp32 under autocast (cross_entropy is on its fp32 list); in the -true regimes it runs
        # in the parameter dtype, which is part of what those regimes show.
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    loss = s.fault(step, loss)
    # Outside autocast: backward runs each op in the dtype its forward used. The scaler multiplies
    # the loss by S (fp16-mixed) so small gradients do not flush to zero in fp16.
    s.scaler.scale(loss).backward()
    s.scaler.unscale_(s.optimizer)  # grads /= S in place, and note whether any is inf/NaN
    # Clip the true gradients (after unscaling); the returned norm is the pre-clip norm.
    grad_norm = torch.nn.utils.clip_grad_norm_(s.model.parameters(), s.clip)
    s.scaler.step(s.optimizer)  # skips optimizer.step() if unscale_ found inf/NaN
    s.scaler.update()  # halves S after a skip, doubles it after `growth_interval` clean steps
    return StepOutput(loss.detach(), grad_norm.detach())


@torch.no_grad()
def evaluate(s: TrainState, batches: list[tuple[torch.Tensor, torch.Tensor]],
             device: torch.device) -> float:
    """Mean cross-entropy (nats per token) over fixed validation batches, in the regime's autocast."""
    s.model.eval()
    total = torch.zeros((), dtype=torch.float32, device=device)
    for inputs, targets in batches:
        inputs, targets = inputs.to(device), targets.to(device)
        with s.autocast():
            logits = s.model(inputs)  # (B, T, V)
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        total += loss.float()
    s.model.train()
    return (total / len(batches)).item()  # one sync per evaluation
