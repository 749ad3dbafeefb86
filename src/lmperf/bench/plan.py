"""From a request (lists per axis, device defaults) to checked RunSpecs, before anything runs.

Everything that can be wrong with the input is found here, so that a bad request exits with one
line before the first child starts: unknown names, non-positive numbers, a context longer than
the model allows, a user model that cannot be imported or returns the wrong shape.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import torch

from lmperf.bench.spec import Grid, RunSpec
from lmperf.errors import SpecError
from lmperf.model.custom import inspect_on_meta
from lmperf.runtime import device as dev
from lmperf.runtime.precision import get_regime, slowness_warning, unsupported_reason


@dataclass
class Plan:
    """The specs of a sweep and what to tell the user before it starts."""

    specs: list[RunSpec]
    device_name: str
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def resolve_optimizer(name: str, device: torch.device) -> str:
    """'auto' -> 'fused' where this device runs fused AdamW, else 'foreach'; others unchanged."""
    if name != "auto":
        return name
    return "fused" if dev.fused_adamw_supported(device) else "foreach"


def plan_bench(args: argparse.Namespace, cpu_defaults: dict, cuda_defaults: dict) -> Plan:
    """Build and check the sweep described by `lmperf bench` arguments.

    Lists left unset (None) take the device's defaults. Raises SpecError, or ModelLoadError for
    a user model that cannot be built or returns the wrong shape.
    """
    device = dev.resolve_device(args.device)
    defaults = cuda_defaults if device.type == "cuda" else cpu_defaults
    fixed = dict(model_context_length=args.model_context, optimizer=resolve_optimizer(args.optimizer, device),
                 warmup=args.warmup, steps=args.steps, seed=args.seed, device=device.type,
                 model=args.model)
    grid = Grid(sizes=args.size or defaults["sizes"], contexts=args.context or defaults["contexts"],
                batches=args.batch, precisions=args.precision or defaults["precisions"],
                modes=args.mode, attentions=args.attention, fixed=fixed)
    specs = grid.expand()
    if len(set(specs)) != len(specs):
        specs = list(dict.fromkeys(specs))  # a value given twice in a list runs once
    plan = Plan(specs=specs, device_name=dev.device_name(device))
    if args.model:
        check_user_models(specs)
        plan.notes.append(f"model {args.model}: --size gives the shape its factory receives")
    for name in dict.fromkeys(s.precision for s in specs):
        regime = get_regime(name)
        if (why := unsupported_reason(regime, device)):
            plan.warnings.append(f"{name} will be recorded as unsupported: {why}")
        elif (slow := slowness_warning(regime, device)):
            plan.warnings.append(slow)
    return plan


def check_user_models(specs: list[RunSpec]) -> None:
    """Build each distinct user-model configuration on the meta device and check its output."""
    seen = set()
    for spec in specs:
        key = (spec.model_config(), spec.batch_size, spec.context_length)
        if key in seen:
            continue
        seen.add(key)
        config = spec.model_config()
        inspect_on_meta(config, spec.model, spec.batch_size, seq=spec.context_length)
        model_ctx = _declared_context(config, spec.model)
        if model_ctx is not None and spec.context_length > model_ctx:
            raise SpecError(f"context {spec.context_length} is longer than the model allows "
                            f"({spec.model} has context_length {model_ctx})")


def _declared_context(config, target: str | None) -> int | None:
    from lmperf.model.custom import build_model

    with torch.device("meta"):
        model = build_model(config, target)
    value = getattr(model, "context_length", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None

