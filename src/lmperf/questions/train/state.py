"""What the training loop needs around THE train step (`lmperf.workload.steps.train_step`):
the step's state for one regime (model, AdamW, GradScaler), the learning-rate setter, the
validation loss, and the loss faults the tests inject."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from lmperf.model.checks import count_params
from lmperf.model.custom import build_model
from lmperf.model.float8 import convert_float8
from lmperf.runtime import device as dev
from lmperf.runtime.precision import Regime, autocast, grad_scaler
from lmperf.questions.train.spec import TrainSpec
from lmperf.workload.steps import StepState

# (step, loss) -> loss, the StepState's `fault`. Tests inject faults through it (e.g. a NaN loss
# at step N); in a normal run it is `no_fault`, so production code has no test branch.
LossFault = Callable[[int, torch.Tensor], torch.Tensor]


def no_fault(step: int, loss: torch.Tensor) -> torch.Tensor:
    """The identity: the loss as the model computed it."""
    return loss


def build_state(spec: TrainSpec, regime: Regime, device: torch.device,
                fault: LossFault = no_fault) -> tuple[StepState, int]:
    """(state, parameter count) for one regime, from the spec's seed.

    Every regime starts from the same fp32 initial weights (seeded before building), cast to the
    regime's parameter dtype: fp32 for the mixed regimes (fp32 master weights, fp32 AdamW state),
    bf16/fp16 in the -true regimes (weights, gradients and AdamW state all in that dtype).
    The state's inputs and targets are empty until the loop sets each step's batch.
    """
    dev.seed_all(spec.seed)
    with torch.device("cpu"):  # built on the CPU: the same initial weights on any device
        model = build_model(spec.model_config())
    model.to(device=device, dtype=regime.param_dtype)
    params = count_params(model)
    convert_float8(model, spec.float8)  # the same weights, its Linear layers in float8
    if spec.compile:  # compiled lazily by the first step (and evaluation) that runs it
        model = torch.compile(model, mode=spec.compile_mode)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr_at(1),
                                  betas=(spec.beta1, spec.beta2), eps=spec.eps,
                                  weight_decay=spec.weight_decay)
    empty = torch.empty(0, dtype=torch.long, device=device)
    state = StepState(model, empty, empty, lambda: autocast(regime, device),
                      grad_scaler(regime, device), optimizer,
                      # inf: unscale and measure the norm every step, never clip (--clip 0)
                      clip=spec.clip if spec.clip > 0 else float("inf"), fault=fault)
    return state, params


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set the learning rate of every parameter group (the schedule is the caller's)."""
    for group in optimizer.param_groups:
        group["lr"] = lr


@torch.no_grad()
def evaluate(state: StepState, batches: list[tuple[torch.Tensor, torch.Tensor]],
             device: torch.device) -> float:
    """Mean cross-entropy (nats per token) over fixed validation batches, in the regime's autocast."""
    state.model.eval()
    total = torch.zeros((), dtype=torch.float32, device=device)
    for inputs, targets in batches:
        inputs, targets = inputs.to(device), targets.to(device)
        with state.autocast():
            logits = state.model(inputs)  # (B, T, V)
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        total += loss.float()
    state.model.train()
    return (total / len(batches)).item()  # one sync per evaluation
