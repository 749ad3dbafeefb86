"""From `lmperf train`'s request (device defaults, data source) to checked TrainSpecs, one per
precision regime, before anything runs.

Everything that can be wrong with the input is found here, so that a bad request exits with one
line before the first job starts: unknown names, bad numbers, a data or token file that is
missing, empty, malformed, too short for the context or holds ids outside the vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from lmperf.core.vocabulary import device_defaults, resolve_threads
from lmperf.errors import SpecError
from lmperf.model.presets import VOCAB_SIZE
from lmperf.runtime import device as dev
from lmperf.runtime.precision import default_regimes, precision_warnings, require_float8
from lmperf.validate import FLOAT8_REGIMES
from lmperf.questions.train.data import BYTE_VOCAB
from lmperf.questions.train.job import load_data
from lmperf.questions.train.spec import TrainSpec


@dataclass
class Plan:
    """The jobs of one `lmperf train` (one per regime) and what to tell the user first."""

    specs: list[TrainSpec]
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def plan_train(*, size: str | None, precision: Sequence[str] | str | None, context: int | None,
               batch: int | None, steps: int | None, lr: float, lr_warmup: int, clip: float,
               eps: float, eval_interval: int, eval_batches: int, seed: int,
               data: str | Path | None, tokens: str | Path | None, vocab_size: int | None,
               attention: str, device: str, threads: int | None, course: str,
               compile: Sequence[bool] | bool, compile_mode: str,
               float8: Sequence[str] | str = "none") -> Plan:
    """Build and check the jobs of `lmperf train` (keywords as its flags; `lmperf.train` holds
    the only defaults).

    Values left None take the device's defaults (core.vocabulary.DEFAULTS["train"]); the
    vocabulary defaults to 256 (bytes) for text and the bundled corpus, 10000 (the course's
    tokenizer) for a token file. A regime listed twice trains once. Each regime trains once
    per `float8` recipe, right after it; with 'none' among them, a regime float8 does not train
    beside (fp32, fp16) trains at none only. Raises SpecError, also for float8 this device
    cannot run.
    """
    dev_ = dev.resolve_device(device)
    d = device_defaults("train", dev_.type)
    pick = lambda value, key: d[key] if value is None else value  # noqa: E731
    # Default regimes too slow on this CPU (bf16 without native support) are left out, saying so.
    names, left_out = (([precision] if isinstance(precision, str) else list(precision), [])
                       if precision is not None else default_regimes(d["precision"], dev_))
    if not names:
        raise SpecError("give at least one --precision")
    vocab = vocab_size if vocab_size is not None else (
        VOCAB_SIZE if tokens is not None else BYTE_VOCAB)
    shared = dict(vocab_size=vocab, context=pick(context, "context"), batch=pick(batch, "batch"),
                  steps=pick(steps, "steps"), lr=lr, lr_warmup=lr_warmup, clip=clip, eps=eps,
                  eval_interval=eval_interval, eval_batches=eval_batches, seed=seed,
                  data=None if data is None else str(data),
                  tokens=None if tokens is None else str(tokens), device=dev_.type,
                  attention=attention, threads=resolve_threads(threads, dev_.type))
    compiles = list(dict.fromkeys(compile if isinstance(compile, (list, tuple)) else [compile]))
    float8s = list(dict.fromkeys([float8] if isinstance(float8, str) else float8))
    specs = [TrainSpec.from_size(pick(size, "size"), name, course, compile=c,
                                 compile_mode=compile_mode, float8=f, **shared)
             for name in dict.fromkeys(names) for f in float8s for c in compiles
             if f == "none" or name in FLOAT8_REGIMES or "none" not in float8s]
    require_float8(float8s, dev_)
    # The job loads its data itself; checking it here as well makes a bad file one line
    # before anything runs rather than one error row per regime.
    corpus = load_data(specs[0])
    s = specs[0]
    plan = Plan(specs, notes=left_out)
    source = "the bundled corpus" if corpus.source == "builtin" else f"{corpus.source} {corpus.name}"
    plan.notes.append(f"training {len(specs)} regime(s) x {s.steps} steps of {s.size} "
                      f"(B={s.batch}, T={s.context}, vocab {s.vocab_size}) on "
                      f"{dev.device_name(dev_)}; data: {source} ({len(corpus.ids):,} tokens)")
    plan.warnings += precision_warnings((s.precision for s in specs), dev_)
    return plan
