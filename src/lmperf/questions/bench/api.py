"""`lmperf.bench(...)`: time forward, backward and the optimizer step over a grid; a Report."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from lmperf.questions.bench.rounds import base_id, pool_rounds
from lmperf.core.jobs import job_id
from lmperf.core.command import err, sweep_options
from lmperf.core.sweep import run_sweep
from lmperf.errors import SpecError
from lmperf.results.store import append_record, ensure_writable, read_records
from lmperf.model.presets import DEFAULT_COURSE

if TYPE_CHECKING:  # pandas: loaded by the report, after the fork server has started
    from lmperf.core.report import Report


def bench(size: Sequence[str] | str | None = None, *,
          model: Sequence[str | None] | str | None = None,
          context: Sequence[int] | int | None = None, batch: Sequence[int] | int = 4,
          precision: Sequence[str] | str | None = None,
          mode: Sequence[str] | str = "train-step", attention: Sequence[str] | str = "naive",
          warmup: Sequence[int] | int = 5, steps: int = 10, seed: int = 0,
          optimizer: str = "auto", device: str = "auto", threads: int | None = None,
          model_context: int = 0, clip: float = 1.0, course: str = DEFAULT_COURSE,
          rounds: int = 1, compile: Sequence[bool] | bool = False,
          compile_mode: str = "default",
          out: str | Path | None = None,
          inline: bool = False, timeout: float | None = None,
          max_memory_gib: float | None = None, resume: bool = False,
          progress: bool = False, predict: Sequence[str] | str | None = None,
          host_us: float | None = None, force: bool = False,
          checkpoint: Sequence[str | int] | str | int = "none", grad_accum: int = 1,
          float8: Sequence[str] | str = "none", vocab_size: int | None = None) -> Report:
    """Benchmark the reference LM (or `model`, "package.module:factory") over the cartesian
    product of every list argument; each run in its own child process unless `inline`.

    `model` may list several factories (None or "reference": the reference LM): an A/B sweep;
    with `rounds` the sides alternate run by run (README: "A/B on a busy machine").

    `checkpoint` (a sweep axis) is the activation checkpointing policy: none, full, op,
    every-K or G blocks per group (`lmperf.core.vocabulary.checkpoint_policy`); `float8` (a
    sweep axis) torchao's float8 training of the Linear layers, 'tensorwise' or 'rowwise',
    beside a bf16 regime (refused before anything runs where the device cannot run it);
    `grad_accum` > 1 makes a train step that many micro-batches of `batch` sequences, one
    optimizer step after the last. `vocab_size`: the vocabulary (a preset's or 10,000 when
    None; a user's model whose logits have another width is refused naming it).
    `compile` (a sweep axis: False, True or [False, True]) runs the whole model through
    torch.compile; the compiling first step is timed apart (metrics.compile_s).
    `rounds` > 1 runs the whole grid that many times, round-robin, and pools each spec's
    samples (every round's record is kept too; see lmperf.questions.bench.rounds).
    Keywords and defaults are `lmperf bench`'s flags (None: the device's default, see
    core.vocabulary.DEFAULTS), except `out`: None keeps the records in memory (the CLI writes
    results/bench.jsonl). Failed runs (oom, error, unsupported) are rows of the Report.
    Raises SpecError / ModelLoadError before anything runs for bad input, SweepInterrupted on
    Ctrl-C (finished rows are kept in `out`). Each job first holds one simulated step's memory
    against what it may use (lmperf.estimate.preflight): one that cannot fit is an 'oom' row
    marked `predicted`, in seconds, unless `force`.

    `predict` (GPU names of the peak table, or "cpu") runs nothing: it PREDICTS each phase's
    time on those devices from per-op counts of the model (lmperf.questions.bench.predict) and
    returns their Report; its records (kind "prediction") are appended to `out`. `host_us`:
    the host's time to issue one op on the GPUs predicted for, in microseconds (None: the
    default, see lmperf.questions.bench.predict.HOST_OP_S).
    """
    # The warm fork server starts importing torch (sweep_options) before this process does
    # anything slow: the plan and the report import torch and pandas, so they load here, after
    # it, on the other core (importing this module stays torch- and pandas-free).
    if host_us is not None and not predict:
        raise SpecError("--host-us is the host time of a --predict GPU: give --predict too")
    if predict:
        from lmperf.questions.bench.plan import models_of

        from lmperf.core.vocabulary import as_list, checkpoint_policy

        if {checkpoint_policy(g) for g in as_list(checkpoint) or ["none"]} != {"none"} \
                or grad_accum not in (None, 1) or set(as_list(float8) or ["none"]) != {"none"}:
            raise SpecError("--predict times one micro-batch without checkpointing or float8: "
                            "for --checkpoint, --grad-accum and --float8 on a GPU, `lmperf "
                            "plan` predicts them")

        if vocab_size is not None:
            raise SpecError("--predict counts a preset's or the model's own vocabulary: "
                            "leave out --vocab-size")
        if not (model is None or isinstance(model, str)) and len(models_of(model)) > 1:
            raise SpecError("--predict takes one --model")
        model = models_of(model)[0]
        return _predict(predict, size=size, model=model, context=context, batch=batch,
                        precision=precision, mode=mode, attention=attention, clip=clip,
                        course=course, model_context=model_context, threads=threads, out=out,
                        host_us=host_us)
    options = sweep_options(inline=inline, timeout=timeout, max_memory_gib=max_memory_gib,
                            resume=resume, progress=progress)
    options.force = force
    from lmperf.questions.bench.plan import plan_bench
    from lmperf.questions.bench.report import build_report

    plan = plan_bench(size=size, model=model, context=context, batch=batch, precision=precision,
                      mode=mode, attention=attention, warmup=warmup, steps=steps, seed=seed,
                      optimizer=optimizer, device=device, threads=threads,
                      model_context=model_context, clip=clip, course=course, compile=compile,
                      compile_mode=compile_mode, checkpoint=checkpoint, grad_accum=grad_accum,
                      float8=float8, vocab_size=vocab_size)
    if out is not None:  # an unwritable --out is the one line, before any note
        ensure_writable(Path(out))
    if progress:
        for note in plan.notes:
            err(f"note: {note}")
        for warning in plan.warnings:
            err(f"warning: {warning}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise SpecError(f"rounds must be a positive integer, got {rounds!r}")
    records = run_sweep(plan.specs, out, options, rounds=rounds)
    if rounds > 1:
        records = _pool(plan.specs, records, rounds, Path(out) if out is not None else None)
    return build_report(records)


def _predict(devices: Sequence[str] | str, *, threads: int | None, out: str | Path | None,
             host_us: float | None, **request: object) -> Report:
    """`bench(predict=...)`: plan the specs for the devices, predict, append, report."""
    from lmperf.questions.bench import predict as pred

    devices = [devices] if isinstance(devices, str) else list(devices)
    if out is not None:  # before the seconds of counting, as a sweep does
        ensure_writable(Path(out))
    records = pred.predict(pred.plan_predictions(devices, **request), devices, threads, host_us)
    if out is not None:
        for record in records:
            append_record(Path(out), record)
    return pred.build_report(records)


def _pool(specs: list, records: list[dict], rounds: int, out: Path | None) -> list[dict]:
    """The pooled record of every spec, in spec order. A spec with a round run now is pooled
    from the latest record of each of its rounds 0..rounds-1 (a resumed sweep's earlier rounds
    are in `out`) and the pooled record appended; a spec whose rounds were all done already
    (--resume) keeps the pooled record it has, nothing appended twice."""
    ran = {base_id(r) for r in records}
    earlier = read_records(out) if out is not None else []
    rounds_of = {(base_id(r), r["round"]): r for r in earlier + records
                 if "round" in r and r["round"] < rounds and base_id(r) in ran}
    pooled = {base_id(r): r for r in pool_rounds(list(rounds_of.values()))}
    if out is not None:
        for record in pooled.values():
            append_record(out, record)
    kept = {base_id(r): r for r in earlier if r.get("rounds") == rounds}
    ids = [job_id(s) for s in specs]
    return [pooled.get(i) or kept[i] for i in ids if i in pooled or i in kept]
