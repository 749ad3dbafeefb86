"""What every strategy must reproduce: single-process training on the GLOBAL batch.

The reference trains a copy of the same initial model with the same AdamW on the concatenation
of all ranks' batches, for as many steps as the strategy ran. Data parallelism with equal
per-rank batches and gradients averaged over ranks is mathematically this; what differs is the
order of floating-point sums (and, with a low-precision compute dtype, where roundings happen).

With a compute dtype the reference mirrors fsdp2's MixedPrecisionPolicy: every parameter cast
to it, under the same autocast. The casts are differentiable, so gradients return to the fp32
master weights.
"""

from __future__ import annotations

import contextlib
from functools import partial
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from lmperf.questions.parallel.strategies import ADAMW

Batch = tuple[torch.Tensor, torch.Tensor]  # (inputs, targets), token ids (B, T) each


def loss_of(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over all B x T positions, in fp32."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def train_reference(model: nn.Module, batches: Callable[[int], Batch], steps: int, lr: float, *,
                    dtype: torch.dtype | None = None, cast: bool = False,
                    device_type: str = "cpu", first: dict | None = None) -> dict[str, torch.Tensor]:
    """Train `model` (modified in place) for `steps` AdamW steps on `batches(step)`; returns
    {name: parameter}. `dtype`: the autocast dtype; `cast`: every parameter cast to it too (see
    the module docstring). `first`, when given, receives the first step's 'loss' (a float) and
    'grads' ({name: gradient}, before the optimizer steps)."""
    autocast = (contextlib.nullcontext if dtype is None else
                partial(torch.autocast, device_type=device_type, dtype=dtype))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, **ADAMW.get(device_type, {}))
    names = dict(model.named_parameters())
    for step in range(steps):
        inputs, targets = batches(step)
        with autocast():
            if cast:  # every parameter in the compute dtype, as fully_shard does
                cast_params = {n: p.to(dtype) for n, p in names.items()}
                logits = torch.func.functional_call(model, cast_params, (inputs,))
            else:
                logits = model(inputs)
            loss = loss_of(logits, targets)
        loss.backward()
        if first is not None and step == 0:
            first.update(loss=loss.item(), grads={n: p.grad.detach().clone()
                                                  for n, p in names.items() if p.grad is not None})
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def compare(params: dict[str, torch.Tensor], reference: dict[str, torch.Tensor], atol: float,
            rtol: float) -> dict:
    """{'equal', 'max_abs_diff', 'worst', 'compared'}: whether every parameter is within
    atol + rtol x |reference| of the reference (torch.allclose), and the largest difference."""
    worst, max_diff, equal = "", 0.0, True
    missing = sorted(set(reference) - set(params))
    for name, ref in reference.items():
        if name not in params:
            continue
        got = params[name].to(ref.dtype).to(ref.device)
        diff = (got - ref).abs().max().item() if ref.numel() else 0.0
        if diff > max_diff:
            worst, max_diff = name, diff
        equal = equal and torch.allclose(got, ref, atol=atol, rtol=rtol)
    return {"equal": equal and not missing, "max_abs_diff": max_diff, "worst": worst,
            "compared": len(reference) - len(missing), "missing": missing,
            "atol": atol, "rtol": rtol}
