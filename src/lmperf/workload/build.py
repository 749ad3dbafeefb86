"""Build what a RunSpec runs: the model (reference LM or a user's), a seeded batch, AdamW and
the GradScaler, as a StepState; and the checks of a user's model that run before anything else."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

from lmperf.model.checkpointing import set_checkpointing
from lmperf.model.checks import inspect_on_meta
from lmperf.model.custom import build_model
from lmperf.model.float8 import convert_float8
from lmperf.runtime import device as dev
from lmperf.runtime.precision import Regime, autocast, grad_scaler, math_dtype_name
from lmperf.workload.spec import RunSpec
from lmperf.workload.steps import NO_OBSERVER, STEPS, Observer, StepState

OPTIMIZER_FLAGS: dict[str, dict] = {"fused": {"fused": True}, "foreach": {"foreach": True},
                                    "loop": {"foreach": False}}


@dataclass
class Prepared:
    """A run ready to step: its state, the step function of its mode, the parameter count, the
    name of the dtype its matmuls compute in (MFU's peak), and `count_flops()`: the FLOPs of one
    step counted on the same model held shape-only (`measure.flops.meta_view`), with the
    reference LM's attention left out (see `count_on_meta`); raises what the model raises there."""

    state: StepState
    step: Callable[[StepState, Observer], object]
    params: int
    math_dtype: str
    count_flops: Callable[[], tuple[int, dict[str, int]]]


def resolve_optimizer(name: str, device: torch.device) -> str:
    """'auto' -> 'fused' where this device runs fused AdamW, else 'foreach'; others unchanged."""
    if name != "auto":
        return name
    return "fused" if dev.fused_adamw_supported(device) else "foreach"


def prepare(spec: RunSpec, device: torch.device, regime: Regime) -> Prepared:
    """Build model, random batch, optimizer and scaler for `spec` on `device` (seeded)."""
    config, clip = spec.model_config(), spec.clip_norm()
    scaler, math_dtype = grad_scaler(regime, device), math_dtype_name(regime)
    dev.seed_all(spec.seed)
    with device:  # build directly on the device: no host copy of a large model
        model = build_model(config, spec.model)
    model.to(dtype=regime.param_dtype)
    convert_float8(model, spec.float8)  # torchtitan's order: float8, checkpointing, compile
    set_checkpointing(model, spec.checkpoint)  # SpecError where the model cannot apply it
    # shared parameters once, as model.checks.count_params (inline: a bench run visits
    # model/checks once, for the output check; docs/architecture.md)
    params = sum(p.numel() for p in model.parameters())
    eager = model
    if spec.compile:  # compiled lazily, by the first step that runs it
        model = torch.compile(model, mode=spec.compile_mode)
    gen = dev.make_generator(device, spec.seed)
    shape = (spec.batch * spec.grad_accum, spec.context)  # every micro-batch of one step
    inputs = torch.randint(0, spec.vocab_size, shape, generator=gen, device=device)
    targets = torch.randint(0, spec.vocab_size, shape, generator=gen, device=device)
    optimizer = None
    if spec.mode == "train-step":
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4,
                                      **OPTIMIZER_FLAGS[spec.optimizer])
    state = StepState(model, inputs, targets, functools.partial(autocast, regime, device), scaler,
                      optimizer, clip=clip, accum=spec.grad_accum)

    def count() -> tuple[int, dict[str, int]]:
        if spec.float8 != "none":  # the same model FLOPs in float8: counted on the model before
            return meta_flops(spec.with_(batch=shape[0]))  # conversion, on the meta device
        set_checkpointing(eager, "none")  # model FLOPs (MFU's convention): no recompute counted
        try:
            return count_on_meta(eager, spec.mode, shape, spec.model is None)
        finally:
            set_checkpointing(eager, spec.checkpoint)

    return Prepared(state, STEPS[spec.mode], params, math_dtype, count)


def count_on_meta(model: nn.Module, mode: str, shape: tuple[int, int],
                  leave_out_attention: bool) -> tuple[int, dict[str, int]]:
    """FLOPs of one step of `mode` on (B, T) = `shape` tokens, counted on a shape-only view of
    `model` (every parameter and buffer a meta tensor: no arithmetic runs, nothing is allocated,
    the model is untouched). Forward and backward are counted (the optimizer's elementwise work
    has no FLOP formula in the counter either way); autocast is left out (FLOPs do not depend on
    dtype). With `leave_out_attention` (the reference LM) every `CausalSelfAttention` runs
    `measure.flops.no_attention` instead of its kernel during the count, whatever `--attention`
    names (flash-triton cannot run on meta, and each kernel would be credited differently); the
    caller adds attention on one convention (`measure.flops.reference_step_flops`)."""
    from lmperf.measure.flops import count_flops, meta_view, no_attention
    from lmperf.model.transformer import CausalSelfAttention

    layers = [m for m in model.modules() if isinstance(m, CausalSelfAttention)]
    kernels = [layer.attention for layer in layers]
    tokens = torch.zeros(shape, dtype=torch.long, device="meta")  # (B, T)
    state = StepState(model, tokens, tokens, contextlib.nullcontext,
                      torch.amp.GradScaler("cpu", enabled=False))
    step = STEPS["forward" if mode == "forward" else "forward-backward"]
    try:
        if leave_out_attention:
            for layer in layers:
                layer.attention = no_attention
        # held for the whole step: backward (and a checkpointed block's recompute) sees meta too
        with meta_view(model):
            return count_flops(lambda: step(state, NO_OBSERVER))
    finally:
        for layer, kernel in zip(layers, kernels):
            layer.attention = kernel


def meta_flops(spec: RunSpec) -> tuple[int, dict[str, int]]:
    """FLOPs of one step of `spec`, its model built on the meta device and counted there
    (`count_on_meta`: what a run's `Prepared.count_flops()` counts, without building the model
    for real). Raises whatever the model raises on meta."""
    config = spec.model_config()
    if spec.model is None:  # its kernel is left out of the count: one that loads anywhere
        config = dataclasses.replace(config, attention="naive")
    with torch.device("meta"):
        model = build_model(config, spec.model)
    return count_on_meta(model, spec.mode, (spec.batch, spec.context), spec.model is None)


def check_user_models(specs: list[RunSpec]) -> None:
    """Build each distinct user-model configuration on the meta device and check its context
    and output (`model.checks.inspect_on_meta`); raises ModelLoadError or SpecError (before
    anything runs)."""
    for config, model, batch, context in dict.fromkeys(
            (s.model_config(), s.model, s.batch, s.context) for s in specs if s.model is not None):
        inspect_on_meta(config, model, batch, seq=context)


def warm_up() -> None:
    """Trigger torch's lazy imports (sympy, the flop counter, ...: ~1 s on a first model build)
    once, in the warm fork server before it forks jobs: the tiny model's forward FLOPs counted
    on the meta device under no_grad. No data, no thread pool, no device and no autograd (whose
    first backward initialises CUDA in the server and breaks every forked child's: see
    docs/architecture.md), yet the same modules a whole step imports."""
    with torch.no_grad():
        meta_flops(RunSpec.from_size("tiny", context=16, batch=1, mode="forward"))
