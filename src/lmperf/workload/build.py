"""Build what a RunSpec runs: the model (reference LM or a user's), a seeded batch, AdamW and
the GradScaler, as a StepState; and the checks of a user's model that run before anything else."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch

from lmperf.errors import SpecError
from lmperf.model.custom import build_model, check_logits, count_params, inspect_on_meta
from lmperf.runtime import device as dev
from lmperf.runtime.precision import Regime, autocast, grad_scaler
from lmperf.workload.spec import RunSpec
from lmperf.workload.steps import NO_OBSERVER, STEPS, Observer, StepState

OPTIMIZER_FLAGS: dict[str, dict] = {"fused": {"fused": True}, "foreach": {"foreach": True},
                                    "loop": {"foreach": False}}


@dataclass
class Prepared:
    """A run ready to step: its state, the step function of its mode, and the parameter count."""

    state: StepState
    step: Callable[[StepState, Observer], object]
    params: int


def resolve_optimizer(name: str, device: torch.device) -> str:
    """'auto' -> 'fused' where this device runs fused AdamW, else 'foreach'; others unchanged."""
    if name != "auto":
        return name
    return "fused" if dev.fused_adamw_supported(device) else "foreach"


def prepare(spec: RunSpec, device: torch.device, regime: Regime) -> Prepared:
    """Build model, random batch, optimizer and scaler for `spec` on `device` (seeded)."""
    dev.seed_all(spec.seed)
    with device:  # build directly on the device: no host copy of a large model
        model = build_model(spec.model_config(), spec.model)
    model.to(dtype=regime.param_dtype)
    if spec.compile:  # compiled lazily, by the first step that runs it
        model = torch.compile(model, mode=spec.compile_mode)
    gen = dev.make_generator(device, spec.seed)
    shape = (spec.batch, spec.context)
    inputs = torch.randint(0, spec.vocab_size, shape, generator=gen, device=device)
    targets = torch.randint(0, spec.vocab_size, shape, generator=gen, device=device)
    optimizer = None
    if spec.mode == "train-step":
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4,
                                      **OPTIMIZER_FLAGS[spec.optimizer])
    state = StepState(model, inputs, targets, lambda: autocast(regime, device),
                      grad_scaler(regime, device), optimizer, clip=spec.clip_norm())
    return Prepared(state, STEPS[spec.mode], count_params(model))


def meta_flops(spec: RunSpec) -> tuple[int, dict[str, int]]:
    """FLOPs of one step of `spec` counted on the meta device: the model and batch have shapes
    but no data, so no arithmetic runs (a `small` step costs tenths of a second instead of
    seconds). Forward and backward are counted (the optimizer's elementwise work has no FLOP
    formula in the counter either way); autocast is left out (FLOPs do not depend on dtype).
    The reference LM is counted with its attention left out (`measure.flops.no_attention` in
    every layer, whatever `--attention` names: flash-triton cannot run on meta, and each kernel
    would be credited differently); the caller adds attention on one convention
    (`measure.flops.reference_step_flops`). A user model is counted as it is. Raises whatever
    the model raises on meta (a user model may not run there): the caller then counts a real step.
    """
    import dataclasses

    from lmperf.measure.flops import count_flops, no_attention
    from lmperf.model.transformer import CausalSelfAttention

    meta = torch.device("meta")
    config = spec.model_config()
    if spec.model is None:
        config = dataclasses.replace(config, attention="naive")  # replaced below; loads anywhere
    with meta:
        model = build_model(config, spec.model)
    if spec.model is None:
        for layer in model.modules():
            if isinstance(layer, CausalSelfAttention):
                layer.attention = no_attention
    shape = (spec.batch, spec.context)
    tokens = torch.zeros(shape, dtype=torch.long, device=meta)
    state = StepState(model, tokens, tokens, contextlib.nullcontext,
                      torch.amp.GradScaler("cpu", enabled=False))
    step = STEPS["forward" if spec.mode == "forward" else "forward-backward"]
    return count_flops(lambda: step(state, NO_OBSERVER))


def check_user_model(spec: RunSpec, state: StepState) -> None:
    """For a user's model, check once that its logits have shape (B, T, vocab)."""
    if spec.model is None:
        return
    with torch.no_grad(), state.autocast():
        out = state.model(state.inputs)
    check_logits(out, spec.batch, spec.context, spec.vocab_size, spec.model)


def check_user_models(specs: list[RunSpec]) -> None:
    """Build each distinct user-model configuration on the meta device and check its output;
    raises ModelLoadError or SpecError (before anything runs)."""
    seen = set()
    for spec in specs:
        if spec.model is None:
            continue
        key = (spec.model_config(), spec.batch, spec.context)
        if key in seen:
            continue
        seen.add(key)
        config = spec.model_config()
        inspect_on_meta(config, spec.model, spec.batch, seq=spec.context)
        model_ctx = _declared_context(config, spec.model)
        if model_ctx is not None and spec.context > model_ctx:
            raise SpecError(f"context {spec.context} is longer than the model allows "
                            f"({spec.model} has context_length {model_ctx})")


def _declared_context(config, target: str | None) -> int | None:
    with torch.device("meta"):
        model = build_model(config, target)
    value = getattr(model, "context_length", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def warm_up() -> None:
    """Trigger torch's lazy imports (sympy, the flop counter, torch.distributed's pieces, ...:
    ~2 s on a first model build) once: one step of the tiny model on the meta device. Meta
    tensors have shapes and no data, so no arithmetic runs, no thread pool starts and no device
    is touched (the warm fork server runs this before forking jobs)."""
    meta_flops(RunSpec.from_size("tiny", context=16, batch=1))
