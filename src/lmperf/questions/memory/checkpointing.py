"""Activation checkpointing's trade-off: saved bytes, peak memory and step time per policy.

For each policy (none, full, op, every-K, groups of g blocks: `set_checkpointing`, non-reentrant
torch.utils.checkpoint): the saved bytes of one forward, timed train steps, then one step under
the per-phase probe. The expected peak of groups, ~ceil(L / g) x BTC + g x one block's
activations, and its price, one more forward per step: docs/commands/memory.md,
"Checkpointing's trade-off, measured".
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from lmperf.core.outcome import Stage, failure
from lmperf.errors import SpecError
from lmperf.validate import checkpoint_every, checkpoint_phrase, checkpoint_policy
from lmperf.measure.stats import summarize
from lmperf.questions.memory.estimate import estimate
from lmperf.units import MIB
from lmperf.model.checkpointing import set_checkpointing
from lmperf.questions.memory.phases import MEMORY_LABELS
from lmperf.questions.memory.saved import measure_saved, measure_spec, meta_equivalent
from lmperf.runtime import device as dev
from lmperf.runtime.precision import get_regime, matmul_precision, unsupported_reason
from lmperf.workload.build import prepare
from lmperf.workload.probe import PhaseProbe, release_freed_memory
from lmperf.workload.spec import RunSpec
from lmperf.workload.steps import NO_OBSERVER, STEPS, StepState


@dataclass
class CheckpointRow:
    """One policy. Bytes are saved-for-backward activations + autocast weight copies."""

    group: str | int  # the policy, canonical ('none': no checkpointing)
    saved_bytes: int | None  # measured during one forward (None: not measured)
    expected_saved_bytes: int | None  # the estimator's (reference LM only)
    recompute_bytes: int | None  # the estimator's transient: one group rebuilt in backward
    peak_mib: float | None  # largest per-phase peak of one train step (RSS on CPU)
    start_mib: float | None  # held when that step started (parameters, optimizer state, ...)
    memory_kind: str
    step_ms: dict | None  # summarize() of the timed steps
    saved_device: str
    status: str = "ok"
    message: str = ""


def check_groups(groups: list[str | int], num_layers: int) -> list[str | int]:
    """Validate checkpointing policies (any spelling `checkpoint_policy` accepts); returns them
    canonical with 'none' first, duplicates dropped. A group or K larger than the model is
    refused (groups: one group of all blocks is G = L; every-K would checkpoint no block)."""
    policies = [checkpoint_policy(g) for g in groups]
    for g in policies:
        size = g if isinstance(g, int) else checkpoint_every(g)
        if size is not None and size > num_layers:
            what = (f"(use {num_layers} for one group of all blocks)" if isinstance(g, int)
                    else "(it would checkpoint no block)")
            raise SpecError(f"--checkpoint {g} is larger than the model's {num_layers} blocks "
                            f"{what}")
    return list(dict.fromkeys(["none", *policies]))


def sweep_checkpointing(spec: RunSpec, groups: list[str | int], steps: int = 3,
                        warmup: int = 1) -> list[CheckpointRow]:
    """Measure every policy in `groups` ('none' is added first: the baseline) for `spec`.

    `spec.mode` is ignored: a checkpoint trade-off is about training (train-step). A regime the
    device lacks gives 'unsupported' rows, a model that cannot be built 'oom' or 'error' rows,
    and an out-of-memory step an 'oom' row for its policy. Raises SpecError for a bad policy
    or a model without checkpointing.
    """
    groups = check_groups(groups, spec.num_layers)
    spec = spec.with_(mode="train-step")
    device = torch.device(spec.device)
    regime = get_regime(spec.precision)
    kind = dev.PeakMemory(device).kind

    def failed(status: str, message: str, **_: object) -> list[CheckpointRow]:
        return [CheckpointRow(g, None, None, None, None, None, kind, None, "", status, message)
                for g in groups]

    if (why := unsupported_reason(regime, device)):
        return failed("unsupported", why)
    on_meta = meta_equivalent(spec)
    rows = []
    with matmul_precision(regime):
        try:
            state = prepare(spec, device, regime).state
        except Exception as exc:  # every group size fails alike
            return failed(**failure(exc, f"building the {spec.precision} model"))
        set_checkpointing(state.model, groups[-1])  # fail early for a model without it
        for g in groups:
            set_checkpointing(state.model, g)
            # op's saved outputs are held by torch's selective-checkpoint cache, which the
            # saved-tensor hooks of measure_saved do not see: not measured (its peak is)
            if g == "op":
                report = None
            elif on_meta:
                report = measure_spec(spec, torch.device("meta"), checkpoint=g)
            else:
                report = measure_saved(state.model, state.inputs, state.targets, state.autocast)
            est = (estimate(spec.model_config(), spec.batch, spec.context, regime,
                            spec.attention, "train-step", g, device=device.type)
                   if spec.model is None and g != "op" else None)  # op: no closed form
            row = CheckpointRow(g, report and report.total() + report.total("weight copy"),
                                est.saved_bytes if est else None,
                                est.recompute_bytes if est else None, None, None, kind, None,
                                "" if report is None else "meta" if on_meta else device.type)
            stage = Stage(f"training with {checkpoint_phrase(g)}")
            try:
                _time_and_probe(state, row, device, steps, warmup)
            except Exception as exc:  # one group size ran out of memory, the others go on
                outcome = failure(exc, stage)
                if outcome["status"] != "oom":
                    raise
                state.model.zero_grad(set_to_none=True)
                row.status, row.message = outcome["status"], outcome["message"][:300]
            dev.free_memory(device)
            rows.append(row)
        set_checkpointing(state.model, "none")
    return rows


def _time_and_probe(state: StepState, row: CheckpointRow, device: torch.device, steps: int,
                    warmup: int) -> None:
    """`warmup` untimed and `steps` timed train steps, then one under the per-phase probe;
    fills the row's step times (ms), peak and start (MiB)."""
    clock = dev.PhaseClock(device)
    for _ in range(warmup):
        STEPS["train-step"](state, NO_OBSERVER)
    times = []
    for _ in range(steps):
        STEPS["train-step"](state, clock)
        times.append(clock.total_ms)
    row.step_ms = summarize(times)
    release_freed_memory()
    probe = PhaseProbe(dev.PeakMemory(device))
    STEPS["train-step"](state, probe)
    key = "allocated" if device.type == "cuda" else "rss"
    row.peak_mib = max(p[key] for p in probe.phases.values() if p.get(key) is not None)
    row.start_mib = probe.start_mib.get(key)


def tradeoff_frame(rows: list[CheckpointRow]) -> pd.DataFrame:
    """The trade-off table: per policy, saved / peak / step time and their ratio to none."""
    base = rows[0]

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    def mib(n: int | None) -> float | None:
        return n / MIB if n is not None else None

    out = []
    for r in rows:
        step = r.step_ms["median"] if r.step_ms else None
        base_step = base.step_ms["median"] if base.step_ms else None
        out.append({
            "group": r.group,
            "saved MiB": mib(r.saved_bytes),
            "expected MiB": mib(r.expected_saved_bytes),
            "saved x": ratio(r.saved_bytes, base.saved_bytes),
            "recompute MiB (est.)": mib(r.recompute_bytes),
            MEMORY_LABELS[r.memory_kind]: r.peak_mib,
            "above start MiB": (r.peak_mib - r.start_mib
                                if r.peak_mib is not None and r.start_mib is not None else None),
            "peak x": ratio(r.peak_mib, base.peak_mib),
            "step ms (median)": step,
            "step x": ratio(step, base_step),
            "status": r.status,
        })
    return pd.DataFrame(out)
