"""`lmperf.dist(...)`: collectives, data-parallel strategies, or an estimate; a Report."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from lmperf.core.command import err, sweep_options
from lmperf.core.report import Report
from lmperf.core.sweep import run_sweep
from lmperf.errors import ResultsFileError, SpecError


def dist(what: str = "all", *, world_size: Sequence[int] | int | None = None,
         collective: Sequence[str] | str | None = None,
         sizes: Sequence[str | int] | str | int | None = None, dtype: str = "fp32",
         iters: int = 20, strategy: Sequence[str] | str | None = None, size: str | None = None,
         context: int | None = None, batch: int | None = None, warmup: int | None = None,
         steps: int | None = None, profile_steps: int = 2, vocab_size: int | None = None, lr: float = 1e-3,
         bucket_mb: float = 1.0, compute_dtype: str = "fp32", compress: str = "none",
         seed: int = 0, device: str = "auto", threads: int | None = None,
         course: str | None = None, plots: str | Path | None = None, out: str | Path | None = None,
         timeout: float | None = None, max_memory_gib: float | None = None,
         resume: bool = False, progress: bool = False, precision: str | None = None,
         checkpoint: int = 0, grad_accum: int = 1, attention: str | None = None,
         reference: bool = True, **estimate_options: object) -> Report:
    """Run `what`: 'comm' (collectives), 'train' (strategies), 'all' (both) or 'estimate'.

    comm: every collective x size (bytes or '1KiB'-style) at each world size, `iters` timed
    iterations after `warmup` (default 5). train: every strategy at each world size (strategy
    'single' at world size 1) on the reference LM preset `size` (`vocab_size` overrides its
    vocabulary), `grad_accum` micro-batches of `batch` sequences of `context` tokens per rank
    and step, `precision` 'fp32' (default) or 'bf16-mixed' (bf16 autocast), `checkpoint` blocks
    per checkpointed group (0: none), `attention` (default naive); `reference` False skips the
    check against one process on the global batch. Each (command, world size) is one torchrun launch; a rank that crashes,
    hangs past `timeout` seconds or runs out of memory is a row naming the rank. None takes the
    device's default (core.vocabulary.DEFAULTS["dist"]). `out`: a JSONL file appended to (None:
    records stay in memory); `plots`: a folder for the PNGs. 'estimate' runs nothing: see
    `lmperf.questions.parallel.api.estimate` for its keywords. Raises SpecError for bad input before anything
    runs, SweepInterrupted on Ctrl-C (finished rows are kept in `out`). 'leaderboard': the 2026
    leaderboard's timed step (`lmperf.questions.parallel.leaderboard`; its keywords precision,
    checkpointing, attention, warmup_ms, rep_ms pass through).
    """
    if what == "estimate":
        return estimate(world_size=world_size, size=size, context=context, course=course,
                        batch=batch, **estimate_options)  # type: ignore[arg-type]
    if what == "leaderboard":  # its own keywords (precision, warmup_ms, rep_ms, ...) pass through
        from lmperf.questions.parallel.leaderboard import leaderboard

        sizes_n = [world_size] if isinstance(world_size, int) else list(world_size or [])
        if len(sizes_n) > 1:
            raise SpecError("leaderboard runs at one world size")
        return leaderboard(size or "leaderboard", out=out,
                           world_size=sizes_n[0] if sizes_n else None, context=context or 32768,
                           batch=batch or 2, vocab_size=vocab_size, device=device,
                           course=course or "2026", timeout=timeout,
                           max_memory_gib=max_memory_gib, seed=seed,
                           **({"precision": precision} if precision else {}),
                           **({"attention": attention} if attention else {}), **estimate_options)
    if estimate_options:
        raise SpecError(f"unknown keyword(s) for dist {what!r}: {', '.join(sorted(estimate_options))}")
    from lmperf.questions.parallel.plan import plan_dist
    from lmperf.questions.parallel.report import build_report

    plan = plan_dist(what, world_size=world_size, collective=collective, sizes=sizes, dtype=dtype,
                     iters=iters, strategy=strategy, size=size, context=context, batch=batch,
                     warmup=warmup, steps=steps, profile_steps=profile_steps, lr=lr,
                     bucket_mb=bucket_mb, compute_dtype=compute_dtype, compress=compress,
                     seed=seed, device=device, threads=threads, timeout=timeout, course=course,
                     vocab_size=vocab_size, max_memory_gib=max_memory_gib, precision=precision,
                     checkpoint=checkpoint, grad_accum=grad_accum, attention=attention,
                     reference=reference)
    if plots is not None:
        _make_folder(Path(plots))
    out = Path(out) if out is not None else None
    jobs = plan.jobs  # with resume, the sweep runs only the items without an ok row
    # The runner starts torchrun, which isolates the ranks: no extra child process around it.
    options = sweep_options(inline=True, resume=resume, progress=progress)
    if progress:
        for note in plan.notes:
            err(f"note: {note}")
    records = _unsupported(plan.unsupported, out, resume) + run_sweep(jobs, out, options)
    report = build_report(records)
    if plots is not None and report.records:
        from lmperf.questions.parallel.plots import plot_records

        for path in plot_records(report.records, plots):
            if progress:
                err(f"plot: {path}")
    return report


def _unsupported(rows: list[tuple[dict, str]], out: Path | None, resume: bool) -> list[dict]:
    """Rows made without launching anything (a compression hook the backend lacks)."""
    from lmperf.results import store
    from lmperf.results.schema import make_record

    records = []
    for spec, why in rows:
        import torch

        from lmperf.runtime import env

        record = make_record("dist", spec, "unsupported", env.capture(torch.device(spec["device"])),
                             message=why)
        if out is not None:
            store.ensure_writable(out)
            store.append_record(out, record)
        records.append(record)
    return records


def estimate(*, world_size: Sequence[int] | int | None = None, size: str | None = None,
             context: int | None = None, course: str | None = None, batch: int | None = None,
             d_model: int | None = None, d_ff: int | None = None, num_layers: int | None = None,
             ffn_only: bool = False, tokens: int = 2**20, gpu: str | None = None,
             bandwidth: float | None = None, gpu_gib: float | None = None,
             tflops: float | None = None, comm_dtype: str = "bf16",
             tp: Sequence[int] | int | None = None, node_bandwidth: float | None = None,
             gpus_per_node: int = 8) -> Report:
    """Analytic memory, FLOPs and communication per device for data-parallel strategies, tensor
    parallelism and FSDP x TP (nothing runs).

    The model is a preset `size` (of the `course` edition's table; default xl), or `d_model` x
    `d_ff` x `num_layers` (with `ffn_only`: the course's accounting model, two Linear layers per
    block and nothing else). `world_size`: the N to tabulate (default 8 64 512); `tp`: the
    tensor-parallel degrees of the FSDP x TP rows (default 2 4 8; plain TP uses t = N);
    `tokens`: tokens per step over all devices; `batch`: sequences of `context` tokens (default
    1024) per data-parallel replica in one micro-batch (default 1), whose activations are in
    every row's memory, simulated as `lmperf plan` and `memory --estimate` do; 0: model
    states only (the FFN-only model always counts its G / d tokens). `gpu`: a device of
    lmperf.runtime.peaks.DEVICES whose datasheet gives the defaults of `bandwidth` (W, GB/s =
    1e9 B/s per direction), `gpu_gib` (memory per device) and `tflops` (C, its dense bf16
    peak); without it 100 GB/s, 80 GiB and 400 TFLOP/s. `node_bandwidth`: GB/s per device and
    direction between nodes of `gpus_per_node` devices, for the collectives whose group spans
    more than one node (None: every device joined at `bandwidth`). `comm_dtype`: what
    gradients, gathered parameters and TP activations travel in. Formulas:
    lmperf.questions.parallel.estimate.
    """
    from lmperf.core.vocabulary import as_list
    from lmperf.questions.parallel import estimate as est
    from lmperf.validate import positive_int

    sizes = as_list(world_size) or [8, 64, 512]
    for n in sizes:
        positive_int("world size", n)
    degrees = as_list(tp) or [2, 4, 8]
    for t in degrees:
        positive_int("tensor-parallel degree", t)
    positive_int("gpus per node", gpus_per_node)
    for name, value in (("bandwidth", bandwidth), ("gpu_gib", gpu_gib), ("tflops", tflops),
                        ("node_bandwidth", node_bandwidth)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not value > 0):
            raise SpecError(f"{name} must be a positive number, got {value!r}")
    positive_int("tokens", tokens)
    batch = 1 if batch is None else batch
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 0:
        raise SpecError(f"batch must be a whole number of sequences >= 0, got {batch!r}")
    c = {"fp32": 4, "bf16": 2, "fp16": 2}.get(comm_dtype)
    if c is None:
        raise SpecError(f"unknown comm dtype {comm_dtype!r}; accepted: fp32, bf16, fp16")
    w, memory, flops, device = est.device_figures(gpu, bandwidth, gpu_gib, tflops)
    shape = _shape(size, d_model, d_ff, num_layers, ffn_only, context, course)
    micro = None if not batch or shape.ffn_only else batch * (context or 1024)
    per_rank = allowance = None
    if micro:  # every rank's memory from one simulated step
        from lmperf.model.presets import DEFAULT_COURSE
        from lmperf.estimate.fit import simulated_memory

        per_rank, allowance, simulated = simulated_memory(
            size or "xl", course or DEFAULT_COURSE, context or 1024, batch, shape)
    links = est.Link(w, node_bandwidth, gpus_per_node)
    if node_bandwidth is not None:
        device += (f", {node_bandwidth:g} GB/s between nodes of {gpus_per_node} devices (a "
                   f"collective spanning more than one node)")
    rows = est.estimate_rows(shape, sizes, bandwidth_gbps=links, gpu_gib=memory, tflops=flops,
                             global_tokens=tokens, comm_dtype_bytes=c,
                             tp_degrees=tuple(degrees), micro_tokens=micro,
                             rank_memory=per_rank, allowance=allowance)
    if shape.ffn_only:
        saved = "activations: bf16 block inputs and first-layer outputs of the FFN-only model"
    elif micro:
        saved = (f"activations: one micro-batch of {batch} x {context or 1024} tokens per "
                 f"replica, bf16 autocast, fused attention; {simulated}")
    else:
        saved = "model states only (--batch 0; --batch B adds a micro-batch's activations)"
    caption = (f"{shape.name}, P = {shape.params:,} parameters, {tokens:,} tokens/step, "
               f"{device}, {comm_dtype} communication; {saved}")
    return est.estimate_report(rows, caption)


def _shape(size, d_model, d_ff, num_layers, ffn_only, context, course):
    from lmperf.questions.parallel import estimate as est

    explicit = (d_model, d_ff, num_layers)
    if any(v is not None for v in explicit):
        if None in explicit:
            raise SpecError("give all of --d-model, --d-ff and --num-layers (or a --size preset)")
        for name, v in zip(("d_model", "d_ff", "num_layers"), explicit):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise SpecError(f"{name} must be a positive integer, got {v!r}")
        if ffn_only:
            return est.ffn_only_shape(d_model, d_ff, num_layers)
        raise SpecError("an explicit shape needs --ffn-only (or use a --size preset for the LM)")
    return est.preset_shape(size, course, context)


def _make_folder(path: Path) -> None:
    """Create the plot folder before anything runs; ResultsFileError if it cannot be."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ResultsFileError(f"cannot create the plot folder {path}: {exc.strerror or exc}") from None
