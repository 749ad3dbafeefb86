"""The training loop: each regime from the same seed and batches, logged per step, stopped early
with a recorded outcome instead of training on NaNs; one self-contained record per regime.

Outcomes (`metrics.outcome` of a record whose status is 'ok'):
- 'completed': all steps ran;
- 'non_finite_loss': a step's loss was NaN or inf; the run stops at that step;
- 'diverged': the loss rose above `diverge_factor` x the first step's loss (worse than the random
  initial weights), or the gradient norm was non-finite `diverge_bad_grads` steps in a row.
A regime that cannot run here is an 'unsupported' record, a crash an 'error' (an out-of-memory
an 'oom') record; the regimes after it still run.
"""

from __future__ import annotations

import math
import traceback
from typing import Callable

import torch

from lmperf.errors import LmperfError
from lmperf.measure.stats import spread_warning, summarize
from lmperf.results.schema import make_record, to_jsonable
from lmperf.runtime import device as dev
from lmperf.runtime import env as envmod
from lmperf.runtime.precision import Regime, get_regime, matmul_precision, slowness_warning, unsupported_reason
from lmperf.train.config import TrainConfig
from lmperf.train.data import Batches, Corpus, eval_windows
from lmperf.train.step import LossFault, TrainState, build_state, evaluate, no_fault, set_lr, train_step

KIND = "train"
OUTCOMES: tuple[str, ...] = ("completed", "non_finite_loss", "diverged")
TIMING_SKIP = 5  # the first steps pay one-time costs (allocation, first calls); kept out of the mean
FINAL_LOSS_STEPS = 10  # "final train loss" is the mean over this many last steps (one is noisy)

# progress(regime, event): event["event"] is 'start' (with the step-0 val_loss), 'step' (the step's
# log entry, plus val_loss when it was evaluated, else None) or 'end' (with the record).
Progress = Callable[[str, dict], None]


def _no_progress(regime: str, event: dict) -> None:
    pass


def train_all(cfg: TrainConfig, corpus: Corpus, device: torch.device, *,
              faults: dict[str, LossFault] | None = None, progress: Progress = _no_progress,
              on_record: Callable[[dict], None] | None = None) -> list[dict]:
    """Train every regime of `cfg` in turn and return one record per regime, in order.

    All regimes draw the same training windows (same seed) and are evaluated on the same fixed
    validation batches. `faults` maps a regime name to a LossFault (tests); `on_record` is called
    with each record as soon as its regime ends (e.g. to append it to a results file).
    """
    val = eval_windows(corpus.val, cfg.eval_batches, cfg.batch, cfg.context, cfg.seed + 1)
    records = []
    for name in cfg.regimes:
        record = train_regime(cfg, name, corpus, device, val,
                              fault=(faults or {}).get(name, no_fault), progress=progress)
        if on_record is not None:
            on_record(record)
        records.append(record)
    return records


def train_regime(cfg: TrainConfig, name: str, corpus: Corpus, device: torch.device,
                 val: list[tuple[torch.Tensor, torch.Tensor]], *, fault: LossFault = no_fault,
                 progress: Progress = _no_progress) -> dict:
    """Train one regime and return its record; never raises for a failure of the run itself."""
    regime = get_regime(name)
    environment = envmod.capture(device)

    def record(status: str, **fields: object) -> dict:
        rec = to_jsonable(make_record(KIND, cfg.spec(name), status, environment, **fields))
        progress(name, {"event": "end", "record": rec})
        return rec

    if (reason := unsupported_reason(regime, device)):
        return record("unsupported", message=reason)
    warnings = [w for w in [slowness_warning(regime, device)] if w]
    try:
        with matmul_precision(regime):
            params, metrics = _train(cfg, regime, corpus, device, val, fault, progress, warnings)
            environment.update(dev.tf32_state())  # what was in force during the run
        return record("ok", params=params, metrics=metrics, warnings=warnings)
    except Exception as exc:  # this regime failed; the next one still runs
        if dev.is_oom(exc):
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            return record("oom", message=f"out of memory: {first}", warnings=warnings)
        extra = {} if isinstance(exc, LmperfError) else {"traceback": traceback.format_exc(limit=8)}
        return record("error", message=f"{type(exc).__name__}: {exc}", warnings=warnings, **extra)
    finally:
        dev.free_memory(device)


def _train(cfg: TrainConfig, regime: Regime, corpus: Corpus, device: torch.device,
           val: list[tuple[torch.Tensor, torch.Tensor]], fault: LossFault, progress: Progress,
           warnings: list[str]) -> tuple[int, dict]:
    """The loop of one regime -> (parameter count, metrics with the per-step log)."""
    state, params = build_state(cfg, regime, device, fault)
    batches = Batches(corpus.train, cfg.batch, cfg.context, cfg.seed)
    clock, memory = dev.PhaseClock(device), dev.PeakMemory(device)
    tokens = cfg.batch * cfg.context
    log: list[dict] = []
    evals = [_eval(state, val, device, 0)]  # step 0: the shared starting point of every regime
    progress(regime.name, {"event": "start", "val_loss": evals[0]["val_loss"]})
    outcome, outcome_step, detail = "completed", None, ""
    first_loss, bad_grads = None, 0
    for step in range(1, cfg.steps + 1):
        inputs, targets = (t.to(device) for t in batches.next())  # (B, T) each; not timed
        set_lr(state.optimizer, cfg.lr_at(step))
        scale_before = _scale(state)
        memory.reset()
        clock.start()  # synchronises first: the step is timed alone
        out = train_step(state, inputs, targets, step)
        clock.lap("step")  # synchronises: the step's work is done
        entry = {"step": step, "lr": cfg.lr_at(step), "loss": out.loss.item(),
                 "grad_norm": out.grad_norm.item(), "scale": scale_before,
                 "skipped": _skipped(state, scale_before), "step_ms": clock.total_ms,
                 "tokens_per_s": tokens / (clock.total_ms / 1e3) if clock.total_ms > 0 else None,
                 "peak_mib": _peak(memory.read())}
        log.append(entry)
        loss, norm = entry["loss"], entry["grad_norm"]
        first_loss = loss if first_loss is None else first_loss
        bad_grads = 0 if math.isfinite(norm) else bad_grads + 1
        stop = _stop_reason(cfg, step, loss, first_loss, bad_grads)
        val_loss = None
        if stop is None and (step % cfg.eval_interval == 0 or step == cfg.steps):
            evals.append(_eval(state, val, device, step))
            val_loss = evals[-1]["val_loss"]
        progress(regime.name, {"event": "step", **entry, "val_loss": val_loss})
        if stop is not None:
            (outcome, detail), outcome_step = stop, step
            break
    summary = _summary(cfg, log, evals, state)
    if summary["step_ms"] and (w := spread_warning({"step": summary["step_ms"]})):
        warnings.append(w + "; the mean step time and tokens/s include the slow steps")
    if not memory.resettable:
        warnings.append("the peak RSS could not be reset per step here; memory peaks are cumulative")
    metrics = {"outcome": outcome, "outcome_step": outcome_step, "outcome_detail": detail,
               "nonfinite_params": _nonfinite_params(state),
               "summary": summary, "log": log, "evals": evals,
               "timer": clock.kind, "memory_kind": memory.kind, "memory_unit": "MiB"}
    return params, metrics


def _stop_reason(cfg: TrainConfig, step: int, loss: float, first_loss: float,
                 bad_grads: int) -> tuple[str, str] | None:
    """(outcome, detail) when the run must stop after this step, else None (see the module doc)."""
    if not math.isfinite(loss):
        return "non_finite_loss", f"the loss was {loss} at step {step}"
    if loss > cfg.diverge_factor * first_loss:
        return "diverged", (f"the loss {loss:.3f} at step {step} is above {cfg.diverge_factor:g} x "
                            f"the first step's {first_loss:.3f}")
    if bad_grads >= cfg.diverge_bad_grads:
        return "diverged", (f"the gradient norm was non-finite in {bad_grads} steps in a row "
                            f"(to step {step})")
    return None


def _eval(state: TrainState, val: list, device: torch.device, step: int) -> dict:
    """Validation loss at `step`, timed separately from the training steps."""
    clock = dev.PhaseClock(device)
    clock.start()
    val_loss = evaluate(state, val, device)
    clock.lap("eval")
    return {"step": step, "val_loss": val_loss, "eval_ms": clock.total_ms}


def _scale(state: TrainState) -> float | None:
    """The GradScaler's current scale S, or None when the regime does not scale (a sync)."""
    return state.scaler.get_scale() if state.scaler.is_enabled() else None


def _skipped(state: TrainState, scale_before: float | None) -> bool:
    """Whether the scaler skipped this step: it lowers S only when it found inf/NaN gradients."""
    after = _scale(state)
    return scale_before is not None and after is not None and after < scale_before


def _nonfinite_params(state: TrainState) -> int:
    """How many parameter elements are inf/NaN after the last step (0 for a healthy run)."""
    with torch.no_grad():
        return int(sum((~torch.isfinite(p)).sum().item() for p in state.model.parameters()))


def _peak(reading: dict[str, float | None]) -> float | None:
    """The figure plotted and tabulated: allocator peak on CUDA, process peak RSS on the CPU."""
    return reading.get("allocated", reading.get("rss"))


def _summary(cfg: TrainConfig, log: list[dict], evals: list[dict], state: TrainState) -> dict:
    """Per-regime figures for the table (times in ms, memory in MiB, losses in nats/token)."""
    times = [e["step_ms"] for e in log]
    timed = times[TIMING_SKIP:] if len(times) > TIMING_SKIP else times
    step_ms = summarize(timed) if timed else None
    tail = [e["loss"] for e in log[-FINAL_LOSS_STEPS:]]
    peaks = [e["peak_mib"] for e in log if e["peak_mib"] is not None]
    return {
        "steps_run": len(log),
        "final_loss": sum(tail) / len(tail) if tail else None,
        "final_loss_steps": len(tail),
        "first_loss": log[0]["loss"] if log else None,
        "final_val_loss": evals[-1]["val_loss"] if evals else None,
        "final_val_step": evals[-1]["step"] if evals else None,
        "step_ms": step_ms,
        "step_ms_skipped_first": len(times) - len(timed),
        "tokens_per_s": cfg.batch * cfg.context / (step_ms["mean"] / 1e3) if step_ms else None,
        "peak_mib": max(peaks) if peaks else None,
        "skipped_steps": sum(bool(e["skipped"]) for e in log),
        "final_scale": _scale(state),
        # clean steps before the scaler doubles S (None without loss scaling)
        "scale_growth_interval": state.scaler.get_growth_interval() if state.scaler.is_enabled() else None,
    }
