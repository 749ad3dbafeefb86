"""`lmperf plan --confirm K`, the side that runs: one planned configuration, run for real, on
torchrun's ranks (`run_cell`: lmperf's readable strategies) or alone on this machine's device as
any forked job (`run_alone`). `measure` runs full steps of `grad_accum` micro-batches after a
zero-gradient step that gives AdamW its state (as the simulator assumes): one under LiveBytes
(the peak the plan predicts; out of memory: it does not fit), then timed steps, untracked.
"""

from __future__ import annotations

import json
import statistics
import time
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

CE = torch.nn.functional.cross_entropy


def _model(plan: dict, seed: int, checkpoint: int, device: torch.device) -> torch.nn.Module:
    from lmperf.estimate.fit import Workload
    from lmperf.model.checkpointing import set_checkpointing
    from lmperf.model.custom import build_model
    from lmperf.runtime import device as dev

    work = Workload(plan["size"], plan["course"], plan["model"], plan["context"],
                    plan["attention"], "cpu")
    spec = work.spec(1, "fp32")
    dev.seed_all(seed)
    model = build_model(spec.model_config(), spec.model).to(device)
    set_checkpointing(model, checkpoint)
    return model


def _setup(cell: dict, model: torch.nn.Module, device: torch.device):
    """(module to call, optimizer, sync after the last backward, autocast dtype or None)."""
    from lmperf.questions.parallel import ddp, fsdp, zero
    from lmperf.questions.parallel.strategies import ADAMW

    dtype = torch.bfloat16 if cell["precision"] == "bf16-mixed" else None
    adamw = dict(lr=1e-4, **ADAMW[device.type])
    if cell["strategy"] == "single":
        return model, torch.optim.AdamW(model.parameters(), **adamw), lambda: None, dtype
    if cell["strategy"] == "fsdp":
        wrapped = fsdp.FSDP(model, dtype)
        return wrapped, torch.optim.AdamW(wrapped.parameters(), **adamw), \
            wrapped.finish_gradient_synchronization, dtype
    wrapped = ddp.FlatDDP(model)
    if cell["strategy"] == "zero1":
        opt = zero.ShardedOptimizer(wrapped.parameters(), torch.optim.AdamW, **adamw)
    else:
        opt = torch.optim.AdamW(wrapped.parameters(), **adamw)
    return wrapped, opt, wrapped.finish_gradient_synchronization, dtype


def _loss(module, x: torch.Tensor, y: torch.Tensor, dtype, share: float) -> torch.Tensor:
    """The step's forward and loss (workload.steps'): the logits (b, T, V) die on return, as
    they do in the step the plan simulates (log-softmax keeps its own output for backward)."""
    with torch.autocast(x.device.type, dtype=dtype, enabled=dtype is not None):
        logits = module(x)  # (b, T, V)
        return CE(logits.flatten(0, 1), y.flatten()) * share


def _step(module, opt, sync, dtype, sizes: list[int], tokens: torch.Tensor) -> None:
    """One optimizer step over micro-batches of `sizes` rows of `tokens` (R, T + 1): each
    micro-batch's loss weighted by its share of the rows, gradients synchronised once, then
    workload.steps' clip and AdamW step."""
    total, start = sum(sizes), 0
    for b in sizes:
        x, y = tokens[start:start + b, :-1], tokens[start:start + b, 1:]
        start += b
        _loss(module, x, y, dtype, b / total).backward()
    sync()
    params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


class LiveBytes(TorchDispatchMode):
    """The peak of live tensor bytes: every storage held at the start (`held`) and every one an
    op creates, each counted once from its creation until it is freed (a weak reference), as
    torch's MemTracker counts them (its module hooks refuse a module called several times in
    one step, which gradient accumulation does)."""

    def __init__(self, held: list[torch.Tensor]):
        super().__init__()
        self.seen: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.live = self.peak = 0
        for t in held:
            self._add(t)

    def _add(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        if st in self.seen or st.device.type == "meta":
            return
        self.seen[st] = n = st.nbytes()
        self.live += n
        self.peak = max(self.peak, self.live)
        weakref.finalize(st, self._free, n)

    def _free(self, n: int) -> None:
        self.live -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._add(t)
        return out


def measure(job, item: str, device: torch.device, rank: int = 0,
            barrier=lambda: None) -> dict:
    """This rank's figures of cell `item` of `job`: the peak of live bytes over one step
    (None: out of memory), the process's peak RSS, CUDA's allocator peak, the timed steps (s)."""
    import resource

    from lmperf.runtime import device as dev

    cell, plan = job.cell(item), json.loads(job.plan)
    model = _model(plan, job.seed, cell["checkpoint"], device)
    module, opt, sync, dtype = _setup(cell, model, device)
    per_replica, b = cell["per_replica"], cell["run_batch"]
    accum = -(-per_replica // b)
    sizes = [b] * (accum - 1) + [per_replica - b * (accum - 1)]
    if cell["run_batch"] != cell["micro_batch"]:
        sizes = [b] * max(1, cell["grad_accum"])  # the boundary cell: b + 1 in every micro-batch
    gen = torch.Generator().manual_seed(job.seed * 7919 + rank)
    tokens = torch.randint(0, model.vocab_size if hasattr(model, "vocab_size") else 1000,
                           (sum(sizes), plan["context"] + 1), generator=gen).to(device)
    with torch.no_grad():  # AdamW's state, as a first step leaves it (what the plan simulates)
        for p in (p for g in opt.param_groups for p in g["params"]):
            p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    local = getattr(opt, "local", None) or opt  # ShardedOptimizer: its rank's AdamW holds it
    held = [*module.parameters(), *module.buffers(), tokens,
            *(v for st in local.state.values() for v in st.values() if torch.is_tensor(v))]
    allocator = dev.PeakMemory(device)
    allocator.reset()
    try:
        with LiveBytes(held) as tracker:
            _step(module, opt, sync, dtype, sizes, tokens)
        peak = tracker.peak
    except Exception as exc:  # on a GPU the boundary cell may not fit: that is its answer
        if not dev.is_oom(exc) or cell["timed"]:
            raise
        peak = None
    times = []
    for i in range(job.steps + 1 if cell["timed"] else 0):
        barrier()
        dev.synchronize(device)
        t0 = time.perf_counter()
        _step(module, opt, sync, dtype, sizes, tokens)
        dev.synchronize(device)
        if i:
            times.append(time.perf_counter() - t0)
    if hasattr(module, "close"):
        module.close()
    return {"peak_bytes": peak, "rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            * 1024, "allocator_peak_mib": allocator.read() if device.type == "cuda" else None,
            "step_s": times}  # ru_maxrss: KiB on Linux


def figures(cell: dict, everyone: list[dict]) -> dict:
    """The cell's record fields from every rank's `measure`: planned and measured side by side
    (the peak of the fullest rank, each step's slowest rank; out of memory: does not fit)."""
    peaks = [r["peak_bytes"] for r in everyone]
    measured = None if None in peaks else max(peaks)
    slowest = [max(ts) for ts in zip(*[r["step_s"] for r in everyone])]  # per step, the last rank
    extra = cell.get("allowance_bytes", 0.0)  # on CUDA the plan's stated allowance on both sides
    return {"metrics": {"planned_peak_bytes": cell["planned_peak_bytes"],
                        "measured_peak_bytes": measured,
                        "peak_error": measured and (cell["planned_peak_bytes"] - measured) / measured,
                        "budget_bytes": cell["budget_bytes"],
                        "planned_fits": cell["planned_peak_bytes"] + extra <= cell["budget_bytes"],
                        "measured_fits": measured is not None
                        and measured + extra <= cell["budget_bytes"],
                        "planned_step_s": cell["planned_step_s"],
                        "measured_step_s": statistics.median(slowest) if slowest else None,
                        "ranks": everyone}}


def run_cell(job, item: str, ctx) -> dict | None:
    """Run one cell on this rank under torchrun; rank 0's payload holds every rank's figures."""
    import torch.distributed as dist

    mine = measure(job, item, ctx.device, ctx.rank, dist.barrier)
    everyone = [None] * ctx.world_size
    ctx.stage.wait("gathering the ranks' figures")
    dist.all_gather_object(everyone, mine)
    return figures(job.cell(item), everyone) if ctx.rank == 0 else None


def run_alone(job) -> dict:
    """A job of one cell on this process's device (`plan --gpus 1 --confirm`): no process
    group, forked from the warm server as any job; its record as a rank's cell would be."""
    from lmperf.core.envelope import measured

    item = job.items()[0]
    return measured("plan", job, lambda j, run: figures(j.cell(item), [measure(j, item, run.device)]),
                    record_spec=job.item_spec(item), first_stage=f"running {item}")
