"""Peak memory per phase across context lengths: forward-only and full train step, per precision.

The course's "two numbers per context length". One model per precision serves every context
(the batch cut to T): forward-only steps first, then the warm-up train steps (AdamW's state),
then one train step per context under the per-phase probe; an out-of-memory context is an 'oom'
row and the sweep goes on. Why and how: docs/commands/memory.md, "How the peaks are measured".
"""

from __future__ import annotations

import dataclasses
import gc
from dataclasses import dataclass

import pandas as pd
import torch

from lmperf.core.outcome import Stage, failure
from lmperf.runtime import device as dev
from lmperf.runtime.precision import get_regime, matmul_precision, unsupported_reason
from lmperf.workload.build import prepare
from lmperf.workload.probe import PhaseProbe, release_freed_memory
from lmperf.workload.spec import RunSpec
from lmperf.workload.steps import NO_OBSERVER, PHASES, STEPS, StepState

MEMORY_LABELS = {"cpu_process_peak_rss": "peak RSS MiB (CPU process)",
                 "cuda_allocator": "peak allocated MiB (GPU)"}


@dataclass
class PhaseRow:
    """One (precision, context, mode) measurement; MiB figures keyed 'rss' (CPU) or
    'allocated' and 'reserved' (CUDA)."""

    precision: str
    context: int
    mode: str
    status: str  # ok | oom | unsupported | error
    memory_kind: str
    start: dict
    peaks: dict[str, dict]  # phase -> figures
    held: dict[str, dict]
    message: str = ""
    params: int | None = None
    traceback: str = ""  # of an unexpected error (not an OOM)

    def peak(self, key: str | None = None) -> float | None:
        """Largest peak over the step's phases, in MiB (`key` default: rss or allocated)."""
        key = key or ("rss" if self.memory_kind == "cpu_process_peak_rss" else "allocated")
        values = [p.get(key) for p in self.peaks.values() if p.get(key) is not None]
        return max(values) if values else None


def baseline_mib(device: torch.device) -> float | None:
    """What the process holds now, in MiB (CPU: resident set after releasing freed memory;
    CUDA: allocated bytes): taken before the model is built, it is the runtime's share."""
    release_freed_memory(collect=True)
    memory = dev.PeakMemory(device)
    memory.reset()
    figures = memory.read()
    return figures.get("allocated", figures.get("rss"))


def _cut(state: StepState, t: int) -> StepState:
    """The same model and optimizer with the batch cut to the first `t` tokens: (B, T)."""
    return dataclasses.replace(state, inputs=state.inputs[:, :t].contiguous(),
                               targets=state.targets[:, :t].contiguous())


def _observe(state: StepState, mode: str, device: torch.device) -> PhaseProbe:
    probe = PhaseProbe(dev.PeakMemory(device))
    STEPS[mode](state, probe)
    return probe


def measure_phases(base: RunSpec, contexts: list[int], modes: tuple[str, ...],
                   warmup: int = 1) -> list[PhaseRow]:
    """Measure per-phase memory of `base`'s precision for every (context, mode), in that order,
    on one model built for the longest context (`base` gives model, batch, attention,
    optimizer, seed and device). Returns rows with status ok, oom, unsupported or error (never
    raises for a failed measurement).
    """
    spec = base.with_(context=max(contexts), mode="train-step",
                      model_context=max(base.model_context, max(contexts)))
    contexts = sorted(contexts)
    device, regime = torch.device(spec.device), get_regime(spec.precision)
    kind = dev.PeakMemory(device).kind
    rows: list[PhaseRow] = []
    params = None

    def row(t: int, m: str, probe: PhaseProbe | None = None, **failed: str) -> None:
        status, msg = failed.get("status", "ok"), failed.get("message", "")
        rows.append(PhaseRow(spec.precision, t, m, status, kind,
                             probe.start_mib if probe else {}, probe.phases if probe else {},
                             probe.held if probe else {}, msg, params,
                             failed.get("traceback", "")))

    def fail_all(**failed: str) -> list[PhaseRow]:
        for t in contexts:
            for m in modes:
                row(t, m, **failed)
        return rows

    if (why := unsupported_reason(regime, device)):
        return fail_all(status="unsupported", message=why)
    with matmul_precision(regime):
        try:
            prepared = prepare(spec, device, regime)
        except Exception as exc:  # every row of this precision fails alike
            return fail_all(**failure(exc, f"building the {spec.precision} model"))
        state, params = prepared.state, prepared.params
        del prepared
        # Inference first, while no gradients or optimizer state exist; the warm-up step that
        # creates AdamW's state runs at the shortest context (the cheapest).
        for m in [m for m in modes if m == "forward"] + [m for m in modes if m != "forward"]:
            if m != "forward" and warmup:
                for _ in range(warmup):
                    _warm_up(state, contexts[0], device)
                warmup = 0
            for t in contexts:
                stage = Stage(f"measuring {m} at context {t}")
                try:
                    row(t, m, _observe(_cut(state, t), m, device))
                except Exception as exc:  # one failed context, the others go on
                    state.model.zero_grad(set_to_none=True)
                    row(t, m, **failure(exc, stage))
                dev.free_memory(device)
        del state
        gc.collect()
        dev.free_memory(device)
    return sorted(rows, key=lambda r: (r.context, modes.index(r.mode)))


def _warm_up(state: StepState, t: int, device: torch.device) -> None:
    """One untimed train step at context `t`. Whatever fails here fails again in the measured
    step that follows, where it is recorded, so a failure is only cleaned up."""
    try:
        STEPS["train-step"](_cut(state, t), NO_OBSERVER)
    except Exception:  # noqa: BLE001 - recorded by the measured step
        state.model.zero_grad(set_to_none=True)
        dev.free_memory(device)


def phase_frame(rows: list[PhaseRow]) -> pd.DataFrame:
    """Long table: one row per (precision, context, mode, phase) with peak and held MiB."""
    out = []
    for r in rows:
        for phase in PHASES[r.mode]:
            peak, held = r.peaks.get(phase, {}), r.held.get(phase, {})
            item = {"precision": r.precision, "context": r.context, "mode": r.mode,
                    "phase": phase, "status": r.status}
            for key in ("rss", "allocated", "reserved"):
                if key in peak or key in r.start:
                    item[f"start {key} MiB"] = r.start.get(key)
                    item[f"peak {key} MiB"] = peak.get(key)
                    item[f"held after {key} MiB"] = held.get(key)
            out.append(item)
    return pd.DataFrame(out)


def two_numbers(rows: list[PhaseRow]) -> pd.DataFrame:
    """The course's table: one row per context, one column per (precision, mode) step peak
    (MiB; NaN where the run did not finish: its status and reason are in the findings)."""
    kinds = {r.memory_kind for r in rows}
    label = MEMORY_LABELS.get(kinds.pop(), "peak MiB") if len(kinds) == 1 else "peak MiB"
    table: dict[int, dict] = {}
    for r in rows:
        cell = r.peak() if r.status == "ok" else None
        table.setdefault(r.context, {"context": r.context})[f"{r.precision} {r.mode}"] = cell
    df = pd.DataFrame(list(table.values()))
    df = df.astype({c: float for c in df.columns if c != "context"})
    df.attrs["label"] = label
    return df
