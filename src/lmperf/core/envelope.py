"""The one run envelope: what every in-process runner does around its measurement.

A runner says what it measures (its `body`); `measured` does the rest, the same way for every
kind: capture the environment, refuse a regime or implementation this device cannot run (an
'unsupported' record), hold the regime's matmul precision during the body, turn any failure into
an 'oom' or 'error' record naming the stage it happened in (`core.outcome.failure`), free the
device's memory, and write the record (`results.schema.make_record`). It never raises for a
failure of the run itself, so a sweep goes on::

    def run_spec(spec):
        return measured(KIND, spec, _measure, precision=spec.precision)

    def _measure(spec, run):          # -> the record's fields: params, metrics, ...
        run.stage.now = "warming up"; ...
        return {"params": n, "metrics": metrics}
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Protocol, TypeVar

import torch

from lmperf.core.outcome import Stage, failure
from lmperf.results.schema import make_record
from lmperf.runtime import device as dev
from lmperf.runtime.env import capture
from lmperf.runtime.precision import (
    Regime, get_regime, matmul_precision, slowness_warning, unsupported_reason,
)


class Spec(Protocol):
    """What the envelope needs of a job spec: its device and its identity as a dict."""

    @property
    def device(self) -> str: ...  # read-only: the job specs are frozen dataclasses

    def to_dict(self) -> dict: ...


S = TypeVar("S", bound=Spec)  # the kind's own spec class: the body receives the spec it was given


@dataclass
class Run:
    """What the envelope hands the body: where it runs, under which regime, what it is doing now
    (`stage.now`: a failure's message names it), warnings for the reader, and record `fields`
    kept whatever the outcome (the body may add to them before it fails)."""

    device: torch.device
    regime: Regime | None
    stage: Stage
    warnings: list[str] = field(default_factory=list)
    fields: dict = field(default_factory=dict)


def measured(kind: str, spec: S, body: Callable[[S, Run], dict], *,
             precision: str | None = None,
             unsupported: Callable[[torch.device], str | None] | None = None,
             first_stage: str = "starting", fields: dict | None = None,
             record_spec: dict | None = None) -> dict:
    """Run `body(spec, run)` (it returns the ok record's fields: `params`, `metrics`, ...) in
    this process inside the envelope and return the record of `kind`. `precision`: the regime
    where the kind has one (checked against the device, its matmul precision held during the
    body, its slowness warned of); `unsupported`: the kind's own check, device -> why it cannot
    run here; `first_stage` names a failure before the body's first `stage.now`; `fields` are
    kept whatever the outcome; `record_spec` replaces `spec.to_dict()` as the records' spec."""
    device = torch.device(spec.device)
    identity = spec.to_dict() if record_spec is None else record_spec
    environment = capture(device)
    regime = None if precision is None else get_regime(precision)
    reason = None if regime is None else unsupported_reason(regime, device)
    warning = None if regime is None else slowness_warning(regime, device)
    holding = contextlib.nullcontext() if regime is None else matmul_precision(regime)
    run = Run(device, regime, Stage(first_stage), [w for w in [warning] if w], dict(fields or {}))
    reason = reason or (unsupported(device) if unsupported is not None else None)
    if reason:
        return make_record(kind, identity, "unsupported", environment, message=reason,
                           **run.fields)
    environment["torch_threads"] = torch.get_num_threads()  # as the launcher set them
    try:
        with holding:
            result = body(spec, run)
            environment.update(dev.tf32_state())  # what was in force during the run
        return make_record(kind, identity, "ok", environment, warnings=run.warnings,
                           **{**run.fields, **result})
    except Exception as exc:  # the run failed; the sweep goes on
        return make_record(kind, identity, env=environment, warnings=run.warnings,
                           **{**run.fields, **failure(exc, run.stage)})
    finally:
        dev.free_memory(device)
