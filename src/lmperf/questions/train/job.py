"""The job of one regime: load the data, train, return the record (the TrainSpec's runner; a
failure of the run is an oom / error / unsupported record, see lmperf.core.outcome). Progress
lines go to stderr: the terminal when inline, else the child's log (an error row has its tail)."""

from __future__ import annotations

import sys
from pathlib import Path

from lmperf.core.envelope import Run, measured
from lmperf.results.schema import to_jsonable
from lmperf.questions.train.data import Corpus, eval_windows, load_corpus, prepare_corpus
from lmperf.questions.train.loop import Progress, status_text, train_loop
from lmperf.questions.train.spec import TrainSpec, regime_label
from lmperf.questions.train.state import LossFault, no_fault

KIND = "train"


def load_data(spec: TrainSpec) -> Corpus:
    """The spec's corpus (its --data or --tokens file, else the bundled one), checked against
    its vocabulary and context; raises SpecError naming the problem."""
    ids, source, name = load_corpus(None if spec.data is None else Path(spec.data),
                                    None if spec.tokens is None else Path(spec.tokens))
    return prepare_corpus(ids, source, name, spec.context, spec.vocab_size)


def run_train(spec: TrainSpec, *, fault: LossFault = no_fault,
              progress: Progress | None = None) -> dict:
    """Train the spec's regime in this process and return its record.

    `fault` injects a loss fault (tests); `progress` receives the loop's events (default: lines
    on stderr at the first step, at each evaluation and at the end). The record's `corpus`
    field describes the data the job loaded (source, name, split sizes, largest id).
    """
    progress = progress or StderrProgress(spec.steps)

    def body(spec: TrainSpec, run: Run) -> dict:
        corpus = load_data(spec)
        run.fields["corpus"] = corpus.describe()
        # fixed validation batches: the same windows at every evaluation and for every regime
        val = eval_windows(corpus.val, spec.eval_batches, spec.batch, spec.context, spec.seed + 1)
        params, metrics = train_loop(spec, run.regime, corpus, run.device, val, stage=run.stage,
                                     warnings=run.warnings, fault=fault, progress=progress)
        return {"params": params, "metrics": metrics}

    record = to_jsonable(measured(KIND, spec, body, precision=spec.precision,
                                  first_stage="loading the data"))
    progress(regime_label(spec.precision, spec.float8), {"event": "end", "record": record})
    return record


class StderrProgress:
    """Plain progress lines on stderr: a regime's step-0 validation loss, its first step, each
    step with a validation loss, and how it ended."""

    def __init__(self, steps: int):
        self.steps = steps

    def __call__(self, regime: str, event: dict) -> None:
        kind = event["event"]
        if kind == "start":
            _err(f"{regime}: validation loss at step 0: {event['val_loss']:.4f}")
        elif kind == "step" and (event["val_loss"] is not None or event["step"] == 1):
            scale = "" if event["scale"] is None else f"  scale {event['scale']:g}"
            val = "" if event["val_loss"] is None else f"  val {event['val_loss']:.4f}"
            _err(f"  {regime:<18} step {event['step']:>5}/{self.steps}  loss {event['loss']:.4f}"
                 f"{val}  grad norm {event['grad_norm']:.3g}{scale}  {event['step_ms']:.1f} ms")
        elif kind == "end":
            rec = event["record"]
            detail = (rec.get("metrics") or {}).get("outcome_detail") or rec.get("message") or ""
            _err(f"{regime}: {status_text(rec)}" + (f" ({detail})" if detail else ""))


def _err(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
