"""`lmperf plan --confirm K`, the side that runs: one planned configuration, run for real, on
torchrun's ranks (`run_cell`: a data-parallel plan on torch's DDP, ZeRO-1 or FSDP2, a TP, PP or
HSDP plan on `dist train`'s layout builder, questions/parallel/layouts.py) or alone on this
machine's device as any forked job (`run_alone`). `measure` runs `dist train`'s step
(questions/parallel/train.py: `train_step`) over the cell's micro-batches after a zero-gradient
step that gives AdamW its state (as the simulator assumes) and one untracked step (DDP's bucket
rebuild, FSDP2's lazy initialisation, the pipeline's shape inference): one step under
LiveBytes (workload/live.py: the peak the plan predicts; out of memory: it does not fit) and the
collective ledger (questions/parallel/ledger.py: bytes per mesh dimension), then timed steps,
untracked.
"""

from __future__ import annotations

import gc
import json
import statistics
import time

import torch

LR = 1e-4


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


def _setup(cell: dict, world_size: int, model: torch.nn.Module, device: torch.device):
    """`dist train`'s Setup of the cell: a data-parallel plan on torch's engine for its
    strategy (`run.DIST`: DDP, ZeroRedundancyOptimizer over DDP, FSDP2; one device: the model
    alone), a TP / PP / HSDP plan on the layout builder (layouts.build: the pipeline's stages,
    TP, fully_shard on the data-parallel mesh), its data-parallel part FSDP2 where it has one;
    bf16-mixed: bf16 autocast over the fp32 weights, as `dist train --precision bf16-mixed`."""
    from lmperf.estimate.layout import Layout
    from lmperf.questions.parallel import layouts, strategies
    from lmperf.questions.parallel.items import NO_STRATEGY, Item
    from lmperf.questions.plan.run import DIST

    if cell["runner"] != "layout":
        setup = strategies.build(
            DIST.get(cell["strategy"], "single"), model, lr=LR, bucket_mb=25,
            compute_dtype="bf16" if cell["precision"] == "bf16-fsdp" else "fp32", device=device)
    else:
        lay = Layout(world_size, cell["tp"], cell["pp"], cell["cp"], cell["dp_replicate"],
                     cell["pp_schedule"], cell["pp_virtual"])
        item = Item("fsdp2" if lay.dp > 1 else NO_STRATEGY, lay,
                    cell["run_batch"] if lay.pp > 1 else 1)
        setup = layouts.build(item, model, lr=LR, batch=sum(cell["sizes"]), device=device)
    if cell["precision"] == "bf16-mixed":
        setup.autocast = lambda: torch.autocast(device.type, dtype=torch.bfloat16)
    return setup


def measure(job, item: str, device: torch.device, rank: int = 0,
            barrier=lambda: None) -> dict:
    """This rank's figures of cell `item` of `job`: the peak of live bytes over one step
    (None: out of memory), the collective bytes per step ({'dim op': S}), the process's peak
    RSS, CUDA's allocator peak, the timed steps (s)."""
    import resource

    from lmperf.questions.parallel.ledger import Ledger
    from lmperf.questions.parallel.strategies import optimizer_state
    from lmperf.questions.parallel.train import _no_range, train_step
    from lmperf.runtime import device as dev
    from lmperf.workload.live import LiveBytes
    from lmperf.workload.steps import NO_OBSERVER

    cell, plan = job.cell(item), json.loads(job.plan)
    model = _model(plan, job.seed, cell["checkpoint"], device)
    sizes = cell["sizes"]
    setup = _setup(cell, job.world_size, model, device)
    module, opt = setup.model, setup.optimizer
    replica = setup.replica[0] if setup.replica else rank

    def run(rows: torch.Tensor) -> None:  # rows (R, T + 1): inputs and their next tokens
        # `dist train`'s step (no clipping: a layout's gradients are DTensors on several meshes)
        train_step(setup, rows[:, :-1], rows[:, 1:], NO_OBSERVER, _no_range, sizes)

    gen = torch.Generator().manual_seed(job.seed * 7919 + replica)  # a replica's ranks alike
    tokens = torch.randint(0, model.vocab_size if hasattr(model, "vocab_size") else 1000,
                           (sum(sizes), plan["context"] + 1), generator=gen).to(device)
    with torch.no_grad():  # AdamW's state, as a first step leaves it (what the plan simulates)
        for p in (p for g in opt.param_groups for p in g["params"]):
            p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    allocator = dev.PeakMemory(device)
    peak, ledger = None, None  # a later round times the cell again, nothing more
    try:
        run(tokens)  # DDP's bucket rebuild, FSDP2's lazy init, the pipeline's shapes: uncounted
        if not cell["round"]:
            held = [*module.parameters(), *module.buffers(), tokens, *optimizer_state(opt)]
            allocator.reset()
            with LiveBytes(held) as tracker, Ledger(setup.groups) as ledger:
                run(tokens)
            peak = tracker.peak
    except Exception as exc:  # on a GPU the boundary cell may not fit: that is its answer
        if not dev.is_oom(exc) or cell["timed"]:
            raise
        peak, ledger = None, None
    times = []
    for i in range(job.steps + 1 if cell["timed"] else 0):
        barrier()
        dev.synchronize(device)
        t0 = time.perf_counter()
        run(tokens)
        dev.synchronize(device)
        if i:
            times.append(time.perf_counter() - t0)
    setup.close()
    dp = "dp_replicate" if cell["strategy"] == "ddp" else "dp_shard"  # an engine's one group
    moved = {f"{dp if row['dim'] == 'world' else row['dim']} {row['collective']}": row["bytes"]
             for row in (ledger.table() if ledger else [])}
    return {"peak_bytes": peak, "collective_bytes": moved,
            "rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "allocator_peak_mib": allocator.read() if device.type == "cuda" else None,
            "step_s": times}  # ru_maxrss: KiB on Linux


def _error(planned: float, measured: float | None) -> float | None:
    return None if not measured else (planned - measured) / measured


def _per_dim(moved: dict) -> dict:
    """{mesh dimension: bytes per step} of {'dim op': bytes}, a pipeline's receives left out
    (each is its neighbour's send, counted there, as the plan counts them)."""
    out: dict = {}
    for key, value in moved.items():
        dim, op = key.split(" ", 1)
        if op != "recv":
            out[dim] = out.get(dim, 0.0) + value
    return out


def figures(cell: dict, everyone: list[dict]) -> dict:
    """The cell's record fields from every rank's `measure`: planned and measured side by side,
    the fullest rank's peak (out of memory: does not fit), each rank's against its pipeline
    rank's plan (`rank_peak_errors`; ranks are pipeline-major, torchtitan's mesh order), each
    rank's collective bytes per mesh dimension, every op's S summed, against the plan's
    (`collective_bytes_errors`, over the dimensions either side has: one the plan lacks is
    -100%, one the run lacks None; per 'dim op' in `planned_` and `measured_collective_bytes`),
    each step's slowest rank."""
    peaks = [r["peak_bytes"] for r in everyone]
    measured = None if None in peaks else max(peaks)
    planned = cell["planned_rank_peak_bytes"]
    per = max(1, len(everyone) // len(planned))  # ranks per pipeline rank
    mine = [planned[min(r // per, len(planned) - 1)] for r in range(len(everyone))]
    sent = [cell["planned_collective_bytes"][min(r // per, len(planned) - 1)]
            for r in range(len(everyone))]
    byte_errors = [{dim: _error(planned_dim.get(dim, 0.0), measured_dim.get(dim))
                    for dim in sorted({*planned_dim, *measured_dim})}
                   for planned_dim, measured_dim in ((_per_dim(p), _per_dim(r["collective_bytes"]))
                                                     for p, r in zip(sent, everyone))]
    slowest = [max(ts) for ts in zip(*[r["step_s"] for r in everyone])]  # per step, the last rank
    extra = cell.get("allowance_bytes", 0.0)  # on CUDA the plan's stated allowance on both sides
    return {"metrics": {"planned_peak_bytes": cell["planned_peak_bytes"],
                        "measured_peak_bytes": measured,
                        "peak_error": measured and (cell["planned_peak_bytes"] - measured) / measured,
                        "planned_rank_peak_bytes": mine, "measured_rank_peak_bytes": peaks,
                        "rank_peak_errors": [_error(p, m) for p, m in zip(mine, peaks)],
                        "planned_collective_bytes": sent,
                        "measured_collective_bytes": [r["collective_bytes"] for r in everyone],
                        "collective_bytes_errors": byte_errors,
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
    gc.collect()  # nothing of the cell (FSDP2's hooks, gloo work) may outlive it
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
