"""`lmperf dist train` on one rank: one strategy, or one layout (layouts.py: TP, PP, HSDP and
their products with FSDP2), on the reference LM, one kind of measurement per pass
(docs/commands/dist.md): for a layout first one step whose loss and gradients are checked
against one process, then timed steps (the slowest rank's), one step counting the bytes this
rank holds, its peak of live bytes and its collectives (the ledger), profiled steps
(`accounting`: communication), and the gathered parameters against one process on the global
batch (`reference`: correctness measured, not assumed). The step is THE training step's order
(forward + loss under autocast, backward, the strategy's gradient synchronisation as its own
phase, optimizer step and zero_grad) over `grad_accum` micro-batches, or a pipeline schedule's
step; no loss scaling and no clipping (it would need the sharded gradients' norm).
"""
from __future__ import annotations

import contextlib
import gc
import tempfile
from pathlib import Path
from typing import Callable, ContextManager

import torch
import torch.distributed as dist

from lmperf.questions.parallel import accounting, items, layouts, strategies
from lmperf.questions.parallel.record import PHASES, payload
from lmperf.questions.parallel.ops import DTYPES
from lmperf.questions.parallel.reference import compare, loss_of, train_reference
from lmperf.questions.parallel.spec import SHARDED, TrainJob
from lmperf.core.rank import RankContext
from lmperf.runtime import device as dev
from lmperf.workload.steps import Observer

# Parameters must match the reference within atol + rtol x |ref| (torch.allclose). fp32 differs
# only by the order of sums (measured ~1e-7 after a few AdamW steps); a bf16/fp16 compute dtype
# rounds partial gradients before they are summed across ranks.
TOLERANCE: dict[str, tuple[float, float]] = {"fp32": (1e-5, 1e-4), "bf16": (5e-3, 5e-2),
                                             "fp16": (2e-3, 2e-2)}
# A layout's first step is also checked before AdamW (which normalises a gradient's scale away:
# a gradient twice too large would still pass the parameters' check): the gradients within
# atol + rtol x |ref|, the loss within rtol. fp32 TP, PP and HSDP differ from one process by
# the order of sums only (measured up to ~6e-8 on gradients of up to ~0.1, docs/commands/dist.md)
GRAD_TOLERANCE: dict[str, tuple[float, float]] = {"fp32": (1e-6, 1e-4), "bf16": (5e-4, 5e-2),
                                                  "fp16": (2e-4, 2e-2)}
LOSS_RTOL: dict[str, float] = {"fp32": 1e-5, "bf16": 1e-2, "fp16": 5e-3}
# A layout's parameters after the run, within this x lr: AdamW moves an element by up to ~lr
# per step whatever its gradient, and by up to lr / eps per unit of gradient near 0, so a
# gradient rounded otherwise (TP's partial sums: ~7e-9) moves a parameter whose gradient is
# ~eps by ~1e-5 per step (measured 1.9e-5 after 4 steps of tp 4); a tenth of lr still catches
# an update that did not happen or went the wrong way
LAYOUT_PARAM_ATOL = 0.1
_REFERENCES: dict[tuple, tuple[dict, dict]] = {}  # rank 0's cache for one job


def build_model(job: TrainJob, device: torch.device) -> torch.nn.Module:
    """The reference LM of `job`'s shape, seeded: identical on every rank and every call."""
    from lmperf.model.custom import build_model as build
    from lmperf.model.presets import ModelConfig

    dev.seed_all(job.seed)
    config = ModelConfig(vocab_size=job.vocab_size, context_length=job.context,
                         d_model=job.d_model, num_layers=job.num_layers, num_heads=job.num_heads,
                         d_ff=job.d_ff, attention=job.attention)
    model = build(config).to(device)
    model.set_checkpointing(job.checkpoint)  # the policy: none, full, op, every-K or groups
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
               accum: int | list[int] = 1) -> torch.Tensor | None:
    """One data-parallel step over `accum` equal micro-batches of the rank's rows (or a list
    of each micro-batch's rows: `plan --confirm`'s), each loss weighted by its share of the
    rows, its phases reported to `obs` and named through `annotate`; returns the rank's loss
    (the mean over its rows; under a pipeline on the last stage's rank only, else None). A
    strategy with `no_sync` runs all but the last micro-batch under it, `sync` after the last
    only: torch's DDP, both ZeRO-1s, naive and flat all-reduce once per step; overlap,
    bucketed and FSDP2 communicate in every micro-batch's backward (an average of sums is the
    sum of averages). A pipeline's schedule splits all the rows into its own micro-batches and
    runs their forwards and backwards interleaved: one phase, 'forward'."""
    rows = len(inputs)
    sizes = ([rows] if setup.pipeline is not None else
             [rows // accum] * accum if isinstance(accum, int) else accum)
    obs.start()
    total = None
    with annotate("lmperf.dist.step"):
        for i, (x, y) in enumerate(zip(inputs.split(sizes), targets.split(sizes))):
            quiet = setup.no_sync is not None and i < len(sizes) - 1
            with setup.no_sync() if quiet else contextlib.nullcontext(), setup.context():
                if setup.pipeline is not None:
                    with annotate("lmperf.dist.forward"), setup.autocast():
                        loss = setup.pipeline(x, y)  # forward and backward, as scheduled
                    obs.lap("forward")
                    obs.lap("backward")
                else:
                    with annotate("lmperf.dist.forward"), setup.autocast():
                        # logits (b, T, V) -> mean CE, weighted by the micro-batch's rows
                        loss = loss_of(setup.model(x), y) / (rows / len(x))
                    obs.lap("forward")
                    with annotate("lmperf.dist.backward"):
                        loss.backward()  # overlapping strategies start all-reduces from hooks here
                    obs.lap("backward")
            if not quiet:
                with annotate("lmperf.dist.sync"):
                    setup.sync()  # wait for (or do) the gradient communication
                obs.lap("sync")
            if loss is not None:
                total = loss.detach() if total is None else total + loss.detach()
        with annotate("lmperf.dist.optimizer"):
            setup.optimizer.step()
            setup.optimizer.zero_grad(set_to_none=True)
        obs.lap("optimizer")
    return total


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
    """Run `item` (a strategy, or a strategy in a layout: layouts.Item) on this rank; rank 0
    returns the record's fields."""
    n, rank, device, stage = ctx.world_size, ctx.rank, ctx.device, ctx.stage
    parsed = items.parse(item, n)
    stage.now = f"building {item}"
    model = build_model(job, device)
    groups = strategies.param_groups(model)
    if parsed.is_layout:
        setup = layouts.build(parsed, model, lr=job.lr, batch=job.batch, device=device)
    else:
        setup = strategies.build(item, model, lr=job.lr, bucket_mb=job.bucket_mb,
                                 compute_dtype=job.compute_dtype if item in SHARDED else "fp32",
                                 device=device)
    if job.precision == "bf16-mixed":  # bf16 autocast over the fp32 weights, every strategy
        setup.autocast = lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    replica, replicas = setup.replica or (rank, n)
    b = job.batch * job.grad_accum  # the replica's rows per step

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = global_batch(job, replicas, step, device)
        return inputs[replica * b:(replica + 1) * b], targets[replica * b:(replica + 1) * b]

    step = 0
    first: dict = {}
    if parsed.is_layout and job.reference:  # one more step: its loss and gradients checked
        stage.now = "a step checked against one process: loss and gradients"
        grads = FirstGradients(setup, job.grad_accum)
        first["loss"] = _value(train_step(setup, *batch(step), grads, _no_range, job.grad_accum))
        first["grads"] = grads.out
        step += 1
    clock = dev.PhaseClock(device)
    samples: dict[str, list[float]] = {p: [] for p in (*PHASES, "step")}
    for i in range(job.warmup + job.steps):
        stage.now = f"{'warm-up' if i < job.warmup else 'timed'} step {i + 1}"
        train_step(setup, *batch(step), clock, _no_range, job.grad_accum)
        step += 1
        if i >= job.warmup:
            for p in PHASES:
                samples[p].append(clock.laps[p])
            samples["step"].append(clock.total_ms)
    stage.now = "counting memory and collectives (one untimed step)"
    held, ledger = _counted_step(setup, batch(step), device, job.grad_accum)
    step += 1
    acct = None
    if job.profile_steps:
        stage.now = f"profiling {job.profile_steps} step(s)"
        acct = _profiled(setup, batch, step, job.profile_steps, n, device, job.grad_accum)
        step += job.profile_steps
    if job.reference:
        stage.wait("gathering the full parameters")
        full = setup.full_params()  # a collective for the sharded strategies and the layouts
    record = setup.record
    stage.now = f"releasing {item}"
    setup.close()
    del setup, model
    gc.collect()  # nothing of this strategy (hooks, gloo work) may outlive it
    mine = {"samples": samples, "held": held, "collectives": ledger, "accounting": acct,
            "replica": replica, "first_loss": first.get("loss")}
    gathered = [None] * n if rank == 0 else None
    check = {"equal": None, "reference": "not checked (--no-reference)"}
    if rank == 0 and job.reference:  # the others wait below: a timeout names rank 0, working
        stage.now = "training the single-process reference"
        check = _check(job, item, full, step, replicas, device, first if parsed.is_layout else None)
    stage.wait("gathering the ranks' results")
    dist.gather_object(mine, gathered, dst=0)
    dist.barrier()
    if rank != 0:
        return None
    return payload(job, parsed, gathered, check, groups, replicas, record)  # type: ignore[arg-type]


def _value(loss: torch.Tensor | None) -> float | None:
    """A loss as a float (a DTensor's, replicated under loss parallelism, read locally)."""
    if loss is None:
        return None
    return float((loss.full_tensor() if hasattr(loss, "full_tensor") else loss).item())


class FirstGradients:
    """An observer that keeps the step's full gradients (rank 0: {name: tensor}) once they are
    synchronised: after the last micro-batch's sync, before the optimizer (a collective)."""

    def __init__(self, setup: strategies.Setup, accum: int):
        self.setup, self.left = setup, accum
        self.out: dict[str, torch.Tensor] = {}

    def start(self) -> None:
        """Nothing to do when the step starts."""

    def lap(self, phase: str) -> None:
        if phase == "sync":
            self.left -= 1
            if self.left == 0 and self.setup.full_grads is not None:
                self.out = self.setup.full_grads()


def _counted_step(setup: strategies.Setup, rows: tuple[torch.Tensor, torch.Tensor],
                  device: torch.device, accum: int) -> tuple[dict, list[dict]]:
    """One untimed step counting what this rank holds (HeldBytes), the peak of its live tensor
    bytes (LiveBytes: parameters, buffers, optimizer state and the batch held at the start) and
    every collective it issues (the ledger). Returns (held figures, ledger rows)."""
    from lmperf.questions.parallel.ledger import Ledger
    from lmperf.workload.live import LiveBytes

    held = HeldBytes(setup, device)
    at_start = [*setup.model.parameters(), *setup.model.buffers(), *rows,
                *strategies.optimizer_state(setup.optimizer)]
    with LiveBytes(at_start) as live, Ledger(setup.groups) as ledger:
        train_step(setup, *rows, held, _no_range, accum)
    held.out["peak_live_bytes"] = live.peak
    return held.out, ledger.table()


def _reference(job: TrainJob, cast: bool, dtype_name: str, steps: int, n: int,
               device: torch.device) -> tuple[dict, dict]:
    """(parameters after `steps` steps, the first step's loss and gradients) of one process
    on the global batch of `n` replicas (`cast`: parameters cast to the dtype, as fsdp2's
    policy does); cached on rank 0 for the job."""
    key = (cast, dtype_name, steps, n)
    if key not in _REFERENCES:
        first: dict = {}
        params = train_reference(
            build_model(job, device), lambda s: global_batch(job, n, s, device), steps, job.lr,
            dtype=DTYPES[dtype_name] if dtype_name != "fp32" else None, cast=cast,
            device_type=device.type, first=first)
        _REFERENCES[key] = (params, first)
    return _REFERENCES[key]


def _check(job: TrainJob, item: str, full: dict, steps: int, n: int, device: torch.device,
           first: dict | None) -> dict:
    """Compare `full` with the single-process reference trained for `steps` steps on the
    global batch of `n` replicas; with `first` (a layout's first step), its loss and gradients
    too (`loss` is set on ranks holding the loss: compared by layout_metrics)."""
    dtype_name = job.compute_dtype if item in SHARDED else "fp32"
    cast = dtype_name != "fp32"
    if job.precision == "bf16-mixed":  # autocast: its tolerance, and the reference under it
        dtype_name = "bf16" if dtype_name == "fp32" else dtype_name
    params, ref_first = _reference(job, cast, dtype_name, steps, n, device)
    atol, rtol = TOLERANCE[dtype_name]
    if first is not None:  # AdamW amplifies a gradient rounded otherwise: see LAYOUT_PARAM_ATOL
        atol = max(atol, LAYOUT_PARAM_ATOL * job.lr)
    result = compare(full, params, atol, rtol)
    if first is not None:
        result["gradients"] = compare(first["grads"], ref_first["grads"],
                                      *GRAD_TOLERANCE[dtype_name])
        result["loss"] = {"reference": ref_first["loss"], "rtol": LOSS_RTOL[dtype_name]}
        result["equal"] = result["equal"] and result["gradients"]["equal"]
    result["reference"] = (f"single process, AdamW lr={job.lr:g}, global batch {n} x "
                           f"{job.batch * job.grad_accum} sequences, {steps} steps, same init "
                           "and data" + (f", {dtype_name} compute mirrored (all cast)"
                                         if cast else "")
                           + (", bf16 autocast" if job.precision == "bf16-mixed" else "")
                           + ("; the first step's loss and gradients too" if first else ""))
    return result
