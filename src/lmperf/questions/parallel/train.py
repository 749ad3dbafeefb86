"""`lmperf dist train` on one rank: one strategy on the reference LM, one kind of measurement
per pass (docs/commands/dist.md): timed steps (the slowest rank's), one step counting the bytes
this rank holds, profiled steps (`accounting`: communication), and the gathered parameters
against one process on the global batch (`reference`: correctness measured, not assumed).
The step is THE training step's order (forward + loss under autocast, backward, the strategy's
gradient synchronisation as its own phase, optimizer step and zero_grad) over `grad_accum`
micro-batches; no loss scaling and no clipping (it would need the sharded gradients' norm).
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import tempfile
from pathlib import Path
from typing import Callable, ContextManager

import torch
import torch.distributed as dist

from lmperf.questions.parallel import accounting, strategies
from lmperf.questions.parallel.ops import DTYPES
from lmperf.questions.parallel.reference import compare, loss_of, train_reference
from lmperf.questions.parallel.spec import SHARDED, TrainJob
from lmperf.core.rank import RankContext
from lmperf.measure.stats import summarize
from lmperf.measure.throughput import tokens_per_s
from lmperf.runtime import device as dev
from lmperf.workload.steps import Observer

PHASES: tuple[str, ...] = ("forward", "backward", "sync", "optimizer")
# Parameters must match the reference within atol + rtol x |ref| (torch.allclose). fp32 differs
# only by the order of sums (measured ~1e-7 after a few AdamW steps); a bf16/fp16 compute dtype
# rounds partial gradients before they are summed across ranks.
TOLERANCE: dict[str, tuple[float, float]] = {"fp32": (1e-5, 1e-4), "bf16": (5e-3, 5e-2),
                                             "fp16": (2e-3, 2e-2)}
_REFERENCES: dict[tuple, dict[str, torch.Tensor]] = {}  # rank 0's cache for one job


def build_model(job: TrainJob, device: torch.device) -> torch.nn.Module:
    """The reference LM of `job`'s shape, seeded: identical on every rank and every call."""
    from lmperf.model.custom import build_model as build
    from lmperf.model.presets import ModelConfig

    dev.seed_all(job.seed)
    config = ModelConfig(vocab_size=job.vocab_size, context_length=job.context,
                         d_model=job.d_model, num_layers=job.num_layers, num_heads=job.num_heads,
                         d_ff=job.d_ff, attention=job.attention)
    model = build(config).to(device)
    model.set_checkpointing(job.checkpoint)  # groups of blocks rebuilt in backward (0: none)
    return model


def global_batch(job: TrainJob, n: int, step: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Step `step`'s global batch: (inputs, targets), each (n x R, T) token ids with R =
    grad_accum x batch rows per rank, the same on every rank (seeded by step); rank r trains
    on rows r*R .. (r+1)*R - 1."""
    gen = torch.Generator().manual_seed(job.seed * 1_000_003 + step)
    tokens = torch.randint(0, job.vocab_size, (n * job.batch * job.grad_accum, job.context + 1),
                           generator=gen)
    return tokens[:, :-1].to(device), tokens[:, 1:].to(device)


def train_step(setup: strategies.Setup, inputs: torch.Tensor, targets: torch.Tensor,
               obs: Observer, annotate: Callable[[str], ContextManager],
               accum: int = 1) -> torch.Tensor:
    """One data-parallel step over `accum` micro-batches of the rank's rows, its phases
    reported to `obs` and named through `annotate`. A strategy with `no_sync` runs all but the
    last micro-batch under it, `sync` after the last only: torch's DDP, both ZeRO-1s, naive and
    flat all-reduce once per step, the readable fsdp its replicated weights (it reduce-scatters
    in every backward); overlap, bucketed and FSDP2 communicate in every micro-batch's backward
    (an average of sums is the sum of averages)."""
    obs.start()
    with annotate("lmperf.dist.step"):
        for i, (x, y) in enumerate(zip(inputs.chunk(accum), targets.chunk(accum))):
            quiet = setup.no_sync is not None and i < accum - 1
            with setup.no_sync() if quiet else contextlib.nullcontext():
                with annotate("lmperf.dist.forward"), setup.autocast():
                    loss = loss_of(setup.model(x), y) / accum  # logits (b, T, V) -> mean CE
                obs.lap("forward")
                with annotate("lmperf.dist.backward"):
                    loss.backward()  # overlapping strategies start all-reduces from hooks in here
                obs.lap("backward")
            if not quiet:
                with annotate("lmperf.dist.sync"):
                    setup.sync()  # wait for (or do) the gradient communication
                obs.lap("sync")
        with annotate("lmperf.dist.optimizer"):
            setup.optimizer.step()
            setup.optimizer.zero_grad(set_to_none=True)
        obs.lap("optimizer")
    return loss.detach()


def _no_range(name: str) -> ContextManager:
    return contextlib.nullcontext()


class HeldBytes:
    """An observer counting what this rank holds: gradients once synchronised, optimizer state
    after the step, and the peak memory of the step."""

    def __init__(self, setup: strategies.Setup, device: torch.device):
        self.setup, self.peak = setup, dev.PeakMemory(device)
        self.out: dict = {}

    def start(self) -> None:
        self.peak.reset()

    def lap(self, phase: str) -> None:
        params = list(self.setup.model.parameters())
        if phase == "sync":
            self.out["gradients_bytes"] = strategies.tensor_bytes(p.grad for p in params)
        if phase == "optimizer":
            self.out["parameters_bytes"] = strategies.tensor_bytes(params)
            self.out["optimizer_bytes"] = strategies.optimizer_state_bytes(self.setup.optimizer)
            self.out["peak_mib"] = self.peak.read()
            self.out["peak_kind"] = self.peak.kind


class DrainAtStepEnd:
    """An observer that waits for the device when the step's last phase ends, inside the step's
    range: on CUDA the host closes the range only once the step's kernels (NCCL ones included)
    have run, so the range's length is the step and the next step's kernels start after it.
    (The accounting also places kernels by their launch, so a trace without it reads right.)"""

    def __init__(self, device: torch.device):
        self.device = device

    def start(self) -> None:
        """Nothing to do when a step starts."""

    def lap(self, phase: str) -> None:
        """Synchronise after the last phase."""
        if phase == PHASES[-1]:
            dev.synchronize(self.device)


def _profiled(setup: strategies.Setup, batch: Callable[[int], tuple], first: int, count: int,
              n: int, device: torch.device, accum: int) -> dict:
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    drain = DrainAtStepEnd(device)
    with tempfile.TemporaryDirectory(prefix="lmperf-dist-trace-") as tmp:
        with profile(activities=activities, record_shapes=True) as prof:
            for s in range(first, first + count):
                train_step(setup, *batch(s), drain, record_function, accum)
            dev.synchronize(device)
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return accounting.analyse(path, n, device.type)


def run_item(job: TrainJob, item: str, ctx: RankContext) -> dict | None:
    """Run strategy `item` on this rank; rank 0 returns the record's fields."""
    n, rank, device, stage = ctx.world_size, ctx.rank, ctx.device, ctx.stage
    b = job.batch * job.grad_accum  # the rank's rows per step

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = global_batch(job, n, step, device)
        return inputs[rank * b:(rank + 1) * b], targets[rank * b:(rank + 1) * b]

    stage.now = f"building {item}"
    model = build_model(job, device)
    groups = strategies.param_groups(model)
    setup = strategies.build(item, model, lr=job.lr, bucket_mb=job.bucket_mb,
                             compute_dtype=job.compute_dtype if item in SHARDED else "fp32",
                             compress=job.compress, device=device)
    if job.precision == "bf16-mixed":  # bf16 autocast over the fp32 weights, every strategy
        setup.autocast = lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    clock = dev.PhaseClock(device)
    samples: dict[str, list[float]] = {p: [] for p in (*PHASES, "step")}
    step = 0
    for i in range(job.warmup + job.steps):
        stage.now = f"{'warm-up' if i < job.warmup else 'timed'} step {i + 1}"
        train_step(setup, *batch(step), clock, _no_range, job.grad_accum)
        step += 1
        if i >= job.warmup:
            for p in PHASES:
                samples[p].append(clock.laps[p])
            samples["step"].append(clock.total_ms)
    stage.now = "counting memory (one untimed step)"
    held = HeldBytes(setup, device)
    train_step(setup, *batch(step), held, _no_range, job.grad_accum)
    step += 1
    acct = None
    if job.profile_steps:
        stage.now = f"profiling {job.profile_steps} step(s)"
        acct = _profiled(setup, batch, step, job.profile_steps, n, device, job.grad_accum)
        step += job.profile_steps
    if job.reference:
        stage.wait("gathering the full parameters")
        full = setup.full_params()  # a collective for the sharded strategies
    stage.now = f"releasing {item}"
    setup.close()
    del setup, model
    gc.collect()  # nothing of this strategy (hooks, gloo work) may outlive it
    mine = {"samples": samples, "held": held.out, "accounting": acct}
    gathered = [None] * n if rank == 0 else None
    check = {"equal": None, "reference": "not checked (--no-reference)"}
    if rank == 0 and job.reference:  # the others wait below: a timeout names rank 0, working
        stage.now = "training the single-process reference"
        check = _check(job, item, full, step, n, device)
    stage.wait("gathering the ranks' results")
    dist.gather_object(mine, gathered, dst=0)
    dist.barrier()
    if rank != 0:
        return None
    return _payload(job, item, gathered, check, groups, n)  # type: ignore[arg-type]


def _check(job: TrainJob, item: str, full: dict, steps: int, n: int, device: torch.device) -> dict:
    """Compare `full` with the single-process reference trained for `steps` steps."""
    dtype_name = job.compute_dtype if item in SHARDED else "fp32"
    cast = ("linear-embedding" if item == "fsdp" else "all") if dtype_name != "fp32" else "none"
    if job.precision == "bf16-mixed":  # autocast: its tolerance, and the reference under it
        dtype_name = "bf16" if dtype_name == "fp32" else dtype_name
    key = (cast, dtype_name, steps)
    if key not in _REFERENCES:
        _REFERENCES[key] = train_reference(
            build_model(job, device), lambda s: global_batch(job, n, s, device), steps, job.lr,
            cast=cast, dtype=DTYPES[dtype_name] if dtype_name != "fp32" else None,
            device_type=device.type)
    atol, rtol = TOLERANCE[dtype_name]
    result = compare(full, _REFERENCES[key], atol, rtol)
    result["reference"] = (f"single process, AdamW lr={job.lr:g}, global batch {n} x "
                           f"{job.batch * job.grad_accum} sequences, {steps} steps, same init "
                           "and data" + (f", {dtype_name} compute mirrored ({cast} cast)"
                                         if cast != "none" else "")
                           + (", bf16 autocast" if job.precision == "bf16-mixed" else ""))
    return result


def _payload(job: TrainJob, item: str, ranks: list[dict], check: dict, groups: dict,
             n: int) -> dict:
    """The record's fields from every rank's results (slowest rank per step)."""
    per_step = lambda phase: [max(col) for col in zip(*(r["samples"][phase] for r in ranks))]  # noqa: E731
    metrics: dict = {"timer": "cuda_event" if job.device == "cuda" else "perf_counter"}
    for phase in (*PHASES, "step"):
        metrics[f"{phase}_ms"] = summarize(per_step(phase))
    metrics["per_rank_step_ms"] = [r["samples"]["step"] for r in ranks]
    metrics["tokens_per_s"] = tokens_per_s(n * job.batch * job.grad_accum * job.context,
                                           metrics["step_ms"])
    compute_dtype = job.compute_dtype if item in SHARDED else "fp32"
    metrics["compute_dtype"] = compute_dtype
    metrics["comm"] = _comm(ranks)
    messages = strategies.analytic_messages(item, groups, compute_dtype=compute_dtype,
                                            compress=job.compress if item == "torch-ddp" else "none",
                                            accum=job.grad_accum)
    metrics["bytes"] = {"analytic_bus_bytes": strategies.analytic_bus_bytes(messages, n),
                        "analytic_backend_bus_bytes": strategies.analytic_bus_bytes(
                            messages, n, job.backend),
                        "analytic_messages": messages, "param_elements": groups,
                        **(metrics["comm"].pop("bytes", {}) if metrics["comm"] else {})}
    metrics["memory"] = {"per_rank": [r["held"] for r in ranks],
                         "unit": "bytes (counted), MiB (peak)"}
    metrics["correctness"] = check
    warnings = [] if check["equal"] is not False else [
        f"parameters differ from the single-process reference by up to {check['max_abs_diff']:.3g} "
        f"({check['worst']}), beyond atol {check['atol']:g} + rtol {check['rtol']:g}"]
    return {"params": groups["total"], "metrics": metrics, "warnings": warnings}


def _comm(ranks: list[dict]) -> dict | None:
    """Comm / compute / overlap / exposed: each rank's means over its profiled steps (a mean
    keeps exposed = comm - overlap), and the figures of the rank with the most exposed
    communication (the one the step waits on); bytes are rank 0's."""
    if not ranks[0]["accounting"]:
        return None
    keys = ("comm_ms", "compute_ms", "overlap_ms", "exposed_ms")
    per_rank = [{k: statistics.fmean(s[k] for s in r["accounting"]["steps"]) for k in keys}
                for r in ranks]
    worst = max(range(len(per_rank)), key=lambda i: per_rank[i]["exposed_ms"])
    steps0 = ranks[0]["accounting"]["steps"]
    acct0 = ranks[0]["accounting"]
    return {"source": acct0["source"], "note": acct0.get("note"), "rank": worst,
            **per_rank[worst], "per_rank": per_rank,
            "unattributed_kernels": [r["accounting"].get("unattributed_kernels", 0) for r in ranks],
            "bytes": {"counted_bus_bytes": statistics.median(s["bus_bytes"] for s in steps0),
                      "collectives": steps0[0]["collectives"]}}
