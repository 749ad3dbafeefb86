"""The training loop of one regime: THE train step on seeded batches, logged per step, stopped
early with a recorded outcome instead of training on NaNs. `metrics.outcome` of an ok record:
'completed', 'non_finite_loss' (a NaN/inf loss; stopped at that step) or 'diverged' (`Watch`)."""

from __future__ import annotations

import math
from typing import Callable

import torch

from lmperf.core.heartbeat import beat
from lmperf.core.outcome import Stage
from lmperf.measure.stats import spread_warning, summarize
from lmperf.runtime import device as dev
from lmperf.runtime.device.clocks import CPU_CLOCK_COVERS
from lmperf.runtime.precision import Regime
from lmperf.questions.train.data import Batches, Corpus
from lmperf.questions.train.spec import TrainSpec, regime_label
from lmperf.questions.train.state import LossFault, build_state, evaluate, no_fault, set_lr
from lmperf.workload.steps import StepState, train_step
from lmperf.measure.throughput import tokens_per_s

TIMING_SKIP = 5  # the first steps pay one-time costs (allocation, first calls); kept out of the mean
FINAL_LOSS_STEPS = 10  # "final train loss" is the mean over this many last steps (one is noisy)

# progress(regime, event): event["event"] is 'start' (with the step-0 val_loss), 'step' (the step's
# log entry, plus val_loss when it was evaluated, else None) or 'end' (with the record).
Progress = Callable[[str, dict], None]


def status_text(record: dict) -> str:
    """'completed', 'non_finite_loss @ step 2', 'diverged @ step 57', or the record's status."""
    if record["status"] != "ok":
        return record["status"]
    m = record["metrics"]
    return m["outcome"] + (f" @ step {m['outcome_step']}" if m.get("outcome_step") else "")


def no_progress(regime: str, event: dict) -> None:
    """A progress callback that shows nothing."""


def train_loop(spec: TrainSpec, regime: Regime, corpus: Corpus, device: torch.device,
               val: list[tuple[torch.Tensor, torch.Tensor]], *, stage: Stage,
               warnings: list[str], fault: LossFault = no_fault,
               progress: Progress = no_progress) -> tuple[int, dict]:
    """Train one regime -> (parameter count, metrics with the per-step log); `stage` says where
    it is (for the message of a failure), `warnings` collects what the reader should know."""
    stage.now = "building the model"
    state, params = build_state(spec, regime, device, fault)
    label = regime_label(regime.name, spec.float8)  # progress lines name float8 runs apart
    batches = Batches(corpus.train, spec.batch, spec.context, spec.seed)
    # One device sync per step, at its start and end (none between phases, which on CUDA would
    # stop the host from queueing the next phase's kernels): the step time bench records too.
    timer, memory = dev.PhaseClock(device, sync="step"), dev.PeakMemory(device)
    tokens = spec.batch * spec.context
    log: list[dict] = []
    stage.now = "evaluating at step 0"
    evals = [_eval(state, val, device, 0)]  # step 0: the shared starting point of every regime
    progress(label, {"event": "start", "val_loss": evals[0]["val_loss"]})
    outcome, outcome_step, detail = "completed", None, ""
    first_loss, bad_grads = None, 0
    for step in range(1, spec.steps + 1):
        stage.now = f"training step {step}"
        state.inputs, state.targets = (t.to(device) for t in batches.next())  # (B, T); untimed
        state.step_number = step
        set_lr(state.optimizer, spec.lr_at(step))
        scale_before = _scale(state)
        memory.reset()
        out = train_step(state, timer)  # the timer synchronises at the step's start and end
        ms, cpu_ms = timer.total_ms, timer.cpu_total_ms
        entry = {"step": step, "lr": spec.lr_at(step), "loss": out.loss.item(),
                 "grad_norm": out.grad_norm.item(), "scale": scale_before,
                 "skipped": _skipped(state, scale_before), "step_ms": ms, "cpu_step_ms": cpu_ms,
                 "tokens_per_s": tokens / (ms / 1e3) if ms > 0 else None,
                 "peak_mib": _peak(memory.read())}
        log.append(entry)
        # if the job is killed (--timeout), its row still says how far it got
        beat(stage="training", steps_done=step, steps=spec.steps, loss=entry["loss"],
             step_ms=[e["step_ms"] for e in log])
        loss, norm = entry["loss"], entry["grad_norm"]
        first_loss = loss if first_loss is None else first_loss
        bad_grads = 0 if math.isfinite(norm) else bad_grads + 1
        stop = _stop_reason(spec, step, loss, first_loss, bad_grads)
        val_loss = None
        if stop is None and (step % spec.eval_interval == 0 or step == spec.steps):
            stage.now = f"evaluating at step {step}"
            evals.append(_eval(state, val, device, step))
            val_loss = evals[-1]["val_loss"]
        progress(label, {"event": "step", **entry, "val_loss": val_loss})
        if stop is not None:
            (outcome, detail), outcome_step = stop, step
            break
    summary = _summary(spec, log, evals, state)
    if summary["step_ms"] and (w := spread_warning({"step": summary["step_ms"]})):
        warnings.append(w + "; the mean step time includes the slow steps, the median (and "
                        "tokens/s, from it) does not")
    if not memory.resettable:
        warnings.append("the peak RSS could not be reset per step here; memory peaks are cumulative")
    metrics = {"outcome": outcome, "outcome_step": outcome_step, "outcome_detail": detail,
               "nonfinite_params": _nonfinite_params(state),
               "summary": summary, "log": log, "evals": evals,
               "timer": timer.kind, "timer_sync": timer.sync,
               "cpu_time": _cpu_time(timer.cpu_kind, log),
               "memory_kind": memory.kind, "memory_unit": "MiB"}
    return params, metrics


def _cpu_time(kind: str | None, log: list[dict]) -> dict | None:
    """The CPU time of the timed steps beside their wall time (`summary.step_ms`): the clock, what
    it covers, and `step_ms` (CPU milliseconds, raw samples; the same steps skipped). None on
    CUDA."""
    times = [e["cpu_step_ms"] for e in log]
    timed = times[TIMING_SKIP:] if len(times) > TIMING_SKIP else times
    if kind is None or not timed:
        return None
    return {"clock": kind, "covers": CPU_CLOCK_COVERS[kind], "step_ms": summarize(timed)}


def _stop_reason(spec: TrainSpec, step: int, loss: float, first_loss: float,
                 bad_grads: int) -> tuple[str, str] | None:
    """(outcome, detail) when the run must stop after this step, else None (see the module doc)."""
    if not math.isfinite(loss):
        return "non_finite_loss", f"the loss was {loss} at step {step}"
    if loss > spec.diverge_factor * first_loss:
        return "diverged", (f"the loss {loss:.3f} at step {step} is above {spec.diverge_factor:g} x "
                            f"the first step's {first_loss:.3f}")
    if bad_grads >= spec.diverge_bad_grads:
        return "diverged", (f"the gradient norm was non-finite in {bad_grads} steps in a row "
                            f"(to step {step})")
    return None


def _eval(state: StepState, val: list, device: torch.device, step: int) -> dict:
    """Validation loss at `step`, timed separately from the training steps."""
    clock = dev.PhaseClock(device)
    clock.start()
    val_loss = evaluate(state, val, device)
    clock.lap("eval")
    return {"step": step, "val_loss": val_loss, "eval_ms": clock.total_ms}


def _scale(state: StepState) -> float | None:
    """The GradScaler's current scale S, or None when the regime does not scale (a sync)."""
    return state.scaler.get_scale() if state.scaler.is_enabled() else None


def _skipped(state: StepState, scale_before: float | None) -> bool:
    """Whether the scaler skipped this step: it lowers S only when it found inf/NaN gradients."""
    after = _scale(state)
    return scale_before is not None and after is not None and after < scale_before


def _nonfinite_params(state: StepState) -> int:
    """How many parameter elements are inf/NaN after the last step (0 for a healthy run)."""
    with torch.no_grad():
        return int(sum((~torch.isfinite(p)).sum().item() for p in state.model.parameters()))


def _peak(reading: dict[str, float | None]) -> float | None:
    """The figure plotted and tabulated: allocator peak on CUDA, process peak RSS on the CPU."""
    return reading.get("allocated", reading.get("rss"))


def _summary(spec: TrainSpec, log: list[dict], evals: list[dict], state: StepState) -> dict:
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
        # --compile: the first step compiled the model (and ran once), apart from the summary
        "compile_s": times[0] / 1e3 if spec.compile and times else None,
        "tokens_per_s": tokens_per_s(spec.batch * spec.context, step_ms),  # the median step
        "peak_mib": max(peaks) if peaks else None,
        "skipped_steps": sum(bool(e["skipped"]) for e in log),
        "final_scale": _scale(state),
        # clean steps before the scaler doubles S (None without loss scaling)
        "scale_growth_interval": state.scaler.get_growth_interval() if state.scaler.is_enabled() else None,
    }
