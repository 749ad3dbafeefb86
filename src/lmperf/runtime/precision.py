"""Precision regimes by name -> autocast context, GradScaler, parameter dtype, TF32 setting.

"Off" is a no-op object (nullcontext, GradScaler(enabled=False)), so the step functions never
branch on the regime.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ContextManager, Iterable, Iterator

import torch

from lmperf.runtime import device as dev
from lmperf.runtime import lowp


@dataclass(frozen=True)
class Regime:
    """A precision regime.

    Attributes:
        name: the regime's name on the command line.
        autocast_dtype: dtype autocast runs eligible ops in (None: no autocast).
        param_dtype: dtype of parameters, gradients and optimizer state.
        loss_scaling: whether a dynamic GradScaler scales the loss before backward.
        tf32: whether fp32 matmuls may use TF32 tensor cores (CUDA only).
        summary: one line for help texts and tables.
    """

    name: str
    autocast_dtype: torch.dtype | None
    param_dtype: torch.dtype
    loss_scaling: bool
    tf32: bool
    summary: str


REGIMES: dict[str, Regime] = {r.name: r for r in (
    Regime("fp32", None, torch.float32, False, False, "fp32 everywhere, TF32 off"),
    Regime("tf32", None, torch.float32, False, True, "fp32 storage, TF32 matmuls (CUDA only)"),
    Regime("bf16-mixed", torch.bfloat16, torch.float32, False, False,
           "autocast bf16 over forward+loss, fp32 params and optimizer"),
    Regime("fp16-mixed", torch.float16, torch.float32, True, False,
           "autocast fp16 over forward+loss, dynamic loss scaling, fp32 params"),
    Regime("fp16-mixed-noscale", torch.float16, torch.float32, False, False,
           "autocast fp16 without loss scaling (shows why scaling exists)"),
    Regime("bf16-true", None, torch.bfloat16, False, False, "params, grads, optimizer state and math in bf16"),
    Regime("fp16-true", None, torch.float16, False, False, "params, grads, optimizer state and math in fp16"),
)}


def get_regime(name: str) -> Regime:
    """Look a regime up by name; raises ValueError listing the accepted names."""
    try:
        return REGIMES[name]
    except KeyError:
        raise ValueError(f"unknown precision {name!r}; accepted: {', '.join(REGIMES)}") from None


LOW_NAMES: dict[torch.dtype, str] = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def compute_dtype(regime: Regime) -> torch.dtype:
    """The dtype the matmuls run in: autocast's dtype, else the parameters' dtype."""
    return regime.autocast_dtype or regime.param_dtype


def autocast(regime: Regime, device: torch.device) -> ContextManager:
    """The context that wraps forward and loss: torch.autocast, or a no-op."""
    if regime.autocast_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=regime.autocast_dtype)


def grad_scaler(regime: Regime, device: torch.device) -> torch.amp.GradScaler:
    """A GradScaler that is enabled only for loss-scaled regimes (disabled: every call passes through)."""
    return torch.amp.GradScaler(device.type, enabled=regime.loss_scaling)


def math_dtype_name(regime: Regime) -> str:
    """The dtype the regime's matmuls compute in, as the peak table names it: 'fp32', 'tf32'
    (fp32 storage, TF32 matmuls), 'bf16' or 'fp16' (MFU's denominator)."""
    if regime.tf32:
        return "tf32"
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(compute_dtype(regime), "fp32")


@contextlib.contextmanager
def matmul_precision(regime: Regime) -> Iterator[None]:
    """Set TF32 on or off for the duration of a run and restore the previous setting after."""
    before = dev.get_tf32()
    dev.set_tf32(regime.tf32)
    try:
        yield
    finally:
        dev.restore_tf32(before)


def unsupported_reason(regime: Regime, device: torch.device) -> str | None:
    """Why this device cannot run the regime, or None if it can."""
    if regime.tf32 and device.type != "cuda":
        return "tf32 is a CUDA tensor-core mode; this device has no TF32 matmuls"
    uses_bf16 = torch.bfloat16 in (regime.autocast_dtype, regime.param_dtype)
    if uses_bf16 and not dev.bf16_supported(device):
        return f"bf16 is not supported on {dev.device_name(device)}"
    return None


def slowness_warning(regime: Regime, device: torch.device) -> str | None:
    """A warning when the regime is known to be pathologically slow on this device, else None."""
    uses_fp16 = torch.float16 in (regime.autocast_dtype, regime.param_dtype)
    if uses_fp16 and device.type == "cpu":
        return (f"{regime.name} on the CPU: most CPUs have no fast fp16 matmul, so expect it to be "
                "far slower than fp32 (tens of times on this project's test machine)")
    uses_bf16 = torch.bfloat16 in (regime.autocast_dtype, regime.param_dtype)
    if uses_bf16 and device.type == "cpu" and (bf16 := lowp.cpu_support("bf16")).slow:
        return f"{regime.name} on this CPU: {bf16.why()}; expect it to be far slower than fp32"
    return None


def default_regimes(names: Iterable[str], device: torch.device) -> tuple[list[str], list[str]]:
    """(the regimes of a default list worth running on `device`, one note per dtype left out).

    On a CPU, a regime that computes in bf16 or fp16 stays in a default only where this CPU
    runs that dtype at a useful speed (runtime.lowp: native flags, else a measured matmul
    ratio); asked for by name, it runs anyway, with slowness_warning's warning."""
    names = list(dict.fromkeys(names))
    if device.type != "cpu":
        return names, []
    kept, left_out = [], {}
    for name in names:
        low = LOW_NAMES.get(compute_dtype(get_regime(name)))
        if low is not None and (support := lowp.cpu_support(low)).slow:
            left_out.setdefault(low, (support, []))[1].append(name)
        else:
            kept.append(name)
    notes = [f"{' '.join(regimes)} left out of the CPU defaults: this CPU has {support.why()}; "
             f"ask for {'it' if len(regimes) == 1 else 'them'} with --precision {' '.join(regimes)}"
             for support, regimes in left_out.values()]
    return kept, notes


def precision_warnings(names: Iterable[str], device: torch.device) -> list[str]:
    """What to tell the user before a run about each distinct regime in `names` on `device`:
    that it will be recorded as unsupported (and why), or that it is known to be slow here."""
    warnings = []
    for name in dict.fromkeys(names):
        regime = get_regime(name)
        if (why := unsupported_reason(regime, device)):
            warnings.append(f"{name} will be recorded as unsupported: {why}")
        elif (slow := slowness_warning(regime, device)):
            warnings.append(slow)
    return warnings


def require_float8(recipes: Iterable[str], device: torch.device) -> None:
    """SpecError, in one line before anything runs, when a float8 recipe of `recipes` ('none'
    aside) cannot run on `device`: torchao missing, a GPU without FP8 tensor cores, a CPU
    whose torch has no float8 scaled matmul (`device.float8_unsupported_reason`)."""
    from lmperf.errors import SpecError

    for recipe in sorted(set(recipes) - {"none"}):
        if (why := dev.float8_unsupported_reason(device, recipe)) is not None:
            raise SpecError(f"--float8 {recipe} cannot run here: {why}")
