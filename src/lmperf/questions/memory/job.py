"""The measuring side of a memory job: run one MemorySpec in this process, return its records.

Runs where the launcher puts it (a child process by default). Never raises for a failure of the
measurement itself: a context or group size that runs out of memory is an 'oom' row, anything
unexpected an 'error' row for every row the job would have written (`core.outcome.failure`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from lmperf.core.outcome import PREFLIGHT, Stage, failure
from lmperf.questions.memory.estimate import block_matmul_params, param_count
from lmperf.questions.memory.spec import MemorySpec
from lmperf.results.schema import make_record, to_jsonable
from lmperf.runtime import device as dev
from lmperf.runtime import env as envmod
from lmperf.runtime.precision import get_regime
from lmperf.names import MODES
from lmperf.estimate.preflight import check_fits
from lmperf.model.checks import shape_on_meta
from lmperf.validate import checkpoint_order
from lmperf.workload.spec import RunSpec

if TYPE_CHECKING:
    from lmperf.questions.memory.saved import SavedReport

KIND = "memory"

# (changes to the run's spec, status, metrics or the failure's fields)
Item = tuple[dict, str, dict]


def make_records(spec: RunSpec, analysis: str, items: list[Item], params: int | None,
                 environment: dict | None = None) -> list[dict]:
    """`kind: "memory"` records, one per item: the run's spec with the item's changes and the
    analysis as its `spec`; an ok item's dict is its metrics, a failed one's gives `message`
    (and `traceback`)."""
    if environment is None:
        # An estimate for CUDA may be made on a machine without a GPU: record this machine then.
        here = spec.device if spec.device == "cpu" or dev.cuda_available() else "cpu"
        environment = envmod.capture(torch.device(here))
    built = {}  # a user's model: the shape and parameters its factory built, not what it was handed
    if spec.model is not None:
        built = {"model_shape": shape_on_meta(spec.model_config(), spec.model)}
        params = params or built["model_shape"]["params"]
    out = []
    for changes, status, fields in items:
        s = {**spec.to_dict(), **changes, "analysis": analysis}
        extra = {"traceback": fields["traceback"]} if fields.get("traceback") else {}
        out.append(make_record(KIND, s, status, environment, params=params, **built,
                               metrics=to_jsonable(fields) if status == "ok" else None,
                               message="" if status == "ok" else fields.get("message", ""),
                               **extra))
    return out


def run_job(spec: MemorySpec) -> list[dict]:
    """Measure `spec` and return its records (see the module docstring)."""
    environment = envmod.capture(torch.device(spec.device))
    environment["torch_threads"] = torch.get_num_threads()
    stage = Stage(f"running the {spec.analysis} analysis")
    try:
        if spec.analysis != "saved":  # saved tensors are counted on meta where they can be
            # the lightest row: when it cannot fit, no row of the job can ('oom' in seconds)
            stage.now = PREFLIGHT
            lightest = min(spec.modes, key=MODES.index) if spec.analysis == "phases" else None
            check_fits(spec.run.with_(context=spec.contexts[0], mode=lightest or "train-step"),
                       torch.device(spec.device), get_regime(spec.run.precision), {},
                       next((g for g in sorted(spec.groups, key=checkpoint_order)
                             if g != "none"), "none"))  # checkpointing's lightest
            stage.now = f"running the {spec.analysis} analysis"
        measure = {"phases": _phases, "saved": _saved, "checkpoint": _checkpoint}[spec.analysis]
        items, params = measure(spec, stage)
    except Exception as exc:  # every row of the job fails alike
        f = failure(exc, stage)
        items, params = [(changes, f["status"], f) for changes in _cells(spec)], None
    finally:
        dev.free_memory(torch.device(spec.device))
    return make_records(spec.run, spec.analysis, items, params, environment)


def _cells(spec: MemorySpec) -> list[dict]:
    """The spec changes of every row the job writes (for failing them all at once)."""
    if spec.analysis == "phases":
        return [{"context": t, "mode": m} for t in spec.contexts for m in spec.modes]
    if spec.analysis == "saved":
        return [{"context": t, "mode": "train-step"} for t in spec.contexts]
    from lmperf.questions.memory.checkpointing import check_groups

    return [{"context": t, "mode": "train-step", "checkpoint_group": g}
            for t in spec.contexts for g in check_groups(list(spec.groups), spec.run.num_layers)]


def _phases(spec: MemorySpec, stage: Stage) -> tuple[list[Item], int | None]:
    from lmperf.questions.memory.phases import baseline_mib, measure_phases

    stage.now = "reading the baseline"
    baseline = baseline_mib(torch.device(spec.device))  # before the model: the runtime's share
    stage.now = "measuring peaks per phase"
    rows = measure_phases(spec.run, list(spec.contexts), spec.modes, warmup=spec.run.warmup)
    items = []
    for r in rows:
        changes = {"context": r.context, "mode": r.mode}
        if r.status != "ok":
            items.append((changes, r.status, {"message": r.message, "traceback": r.traceback}))
            continue
        items.append((changes, "ok", {
            "memory": {"kind": r.memory_kind, "unit": "MiB", "phases": r.peaks},
            "start": r.start, "held": r.held, "baseline_mib": baseline}))
    return items, next((r.params for r in rows if r.params), None)


def _saved(spec: MemorySpec, stage: Stage) -> tuple[list[Item], int | None]:
    from lmperf.questions.memory.saved import measure_spec, meta_equivalent

    items = []
    for t in spec.contexts:
        run = spec.run.with_(context=t, mode="train-step")
        on = torch.device("meta") if meta_equivalent(run) else torch.device(spec.device)
        stage.now = f"measuring saved tensors at context {t} (on {on.type})"
        changes = {"context": t, "mode": "train-step"}
        try:
            rep = measure_spec(run, on)
        except Exception as exc:  # one context failed, the others go on
            f = failure(exc, stage)
            items.append((changes, f["status"], f))
            continue
        finally:
            dev.free_memory(torch.device(spec.device))
        items.append((changes, "ok", {"saved": {
            "activation_bytes": rep.total(), "weight_copy_bytes": rep.total("weight copy"),
            "residual_bytes": rep.residual_bytes, "measured_on": rep.device,
            "per_group": rep.group_bytes(), "groups": rep.by_group().to_dict("records"),
            "square_bytes": _square_bytes(rep, t), "top": rep.top(spec.top).to_dict("records"),
            "block": _one_block(rep, run, spec.top)}}))
    run = spec.run
    return items, param_count(run.model_config()) if run.model is None else None


def _one_block(rep: SavedReport, run: RunSpec, top: int) -> dict | None:
    """The first Transformer block: its largest saved activations and its gradient bytes (its
    parameter count times the regime's parameter dtype: gradients take the parameters' dtype).
    None for a model without named blocks."""
    blocks = rep.block_bytes()
    if not blocks:
        return None
    name = next(iter(blocks))
    # the matmuls (estimate.block_matmul_params: GQA's narrower k, v included) and 2 norms
    params = None if run.model else block_matmul_params(run.model_config()) + 2 * run.d_model
    dtype = get_regime(run.precision).param_dtype
    return {"name": name, "activation_bytes": blocks[name],
            "top": rep.top(top, group=name).to_dict("records"), "params": params,
            "grad_dtype": str(dtype).replace("torch.", ""),
            "grad_bytes": None if params is None else params * dtype.itemsize}


def _square_bytes(rep: SavedReport, t: int) -> int:
    """Counted activation bytes of T x T tensors (scores, probabilities, mask)."""
    return sum(x.bytes for x in rep.tensors
               if x.kind == "activation" and len(x.shape) >= 2 and x.shape[-1] == x.shape[-2] == t)


def _checkpoint(spec: MemorySpec, stage: Stage) -> tuple[list[Item], int | None]:
    from lmperf.questions.memory.checkpointing import sweep_checkpointing

    items = []
    for t in spec.contexts:
        stage.now = f"sweeping checkpoint groups at context {t}"
        rows = sweep_checkpointing(spec.run.with_(context=t), list(spec.groups),
                                   steps=spec.run.steps, warmup=spec.run.warmup)
        for r in rows:
            changes = {"context": t, "mode": "train-step", "checkpoint_group": r.group}
            if r.status != "ok":
                items.append((changes, r.status, {"message": r.message}))
                continue
            items.append((changes, "ok", {
                "saved_bytes": r.saved_bytes, "expected_saved_bytes": r.expected_saved_bytes,
                "recompute_bytes": r.recompute_bytes, "peak_mib": r.peak_mib,
                "start_mib": r.start_mib, "memory_kind": r.memory_kind, "step_ms": r.step_ms,
                "saved_measured_on": r.saved_device}))
    return items, None
