"""The distributed paths, checked for real in one torchrun launch through `lmperf dist`'s own
launcher (`core.torchrun.run_job`): the collectives against a locally computed reference, one
training step of each readable strategy against single-process training, and (CUDA) every
rank's memory cap on its own GPU (docs/commands/doctor.md). The collectives' inputs are small
integers stored as fp32, so every sum is exact in any order: the comparison is `torch.equal`.
On the CPU this is 2 gloo ranks; on CUDA one NCCL rank per GPU (2 or more).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, ClassVar

import torch

from lmperf.questions.doctor.checks import Context, Outcome, fail, passed, skip
from lmperf.core.rank import Ranks
from lmperf.results.schema import SpecDict
from lmperf.units import GIB, MIB

STRATEGIES: tuple[str, ...] = ("naive", "flat", "overlap", "bucketed", "zero1")
"""lmperf's own (readable) strategies; torch's engines (torch-ddp, fsdp2) are torch's to test."""
CAP_GIB = 2.0
"""The per-rank cap of the CUDA launch; the cap item then allocates CAP_GIB + 1 GiB."""
SHAPE = dict(vocab_size=128, context_length=16, d_model=32, num_layers=2, num_heads=2, d_ff=64)
BATCH, LR, SEED = 2, 1e-2, 0
TIMEOUT_S = 240.0


@dataclass(frozen=True)
class DistCheck(SpecDict, Ranks):
    """The doctor's distributed job: items 'collectives', 'strategies' and (CUDA) 'memory-cap';
    world_size, backend, device, threads and the launch options: `Ranks`."""

    kind: ClassVar[str] = "doctor"
    runner: ClassVar[str] = "lmperf.core.torchrun:run_job"
    worker: ClassVar[str] = "lmperf.questions.doctor.distjob:run_item"

    checks: tuple[str, ...]
    timeout_s: float = field(default=TIMEOUT_S, kw_only=True)

    def items(self) -> list[str]:
        """The checks, in order."""
        return list(self.checks)

    def item_spec(self, item: str) -> dict:
        """The record spec of one item."""
        return {"what": "doctor", "item": item, "world_size": self.world_size,
                "backend": self.backend, "device": self.device}

    def with_items(self, items: list[str]) -> "DistCheck":
        """Only the items in `items` (the launcher relaunches what is left after a failure)."""
        return DistCheck(**{**self.to_dict(), "checks": tuple(items)})

    def label(self) -> str:
        """A short name for messages."""
        return f"doctor dist checks n={self.world_size} {self.backend}"


# --- on every rank ------------------------------------------------------------------------------

def _collectives(device: torch.device, rank: int, n: int) -> dict[str, bool]:
    """Each collective on small-integer fp32 inputs against the locally computed answer."""
    import torch.distributed as dist

    from lmperf.questions.parallel.ops import all_gather_flat, reduce_scatter_flat

    def part(r: int, k: int) -> torch.Tensor:  # rank r's input (k,), integers below 2**12
        return ((torch.arange(k) * 7 + 1000 * r) % 4093).float().to(device)

    out: dict[str, bool] = {}
    for k in (1024, 4 * MIB):  # 4 KiB, and 16 MiB (NCCL's chunked, pipelined protocols)
        tag = f"{4 * k // 1024} KiB" if k < 2**18 else f"{4 * k // MIB} MiB"
        x = part(rank, k)
        total = sum(part(r, k) for r in range(n))
        summed = x.clone()
        dist.all_reduce(summed)
        out[f"all_reduce {tag}"] = torch.equal(summed, total)
        gathered = torch.empty(n * k, device=device)
        all_gather_flat(gathered, x)
        out[f"all_gather {tag}"] = torch.equal(gathered, torch.cat([part(r, k) for r in range(n)]))
        full = torch.cat([part(rank + s, k) for s in range(n)])  # (n k,) a different one per rank
        expected = sum(torch.cat([part(r + s, k) for s in range(n)]) for r in range(n))
        mine = torch.empty(k, device=device)
        reduce_scatter_flat(mine, full)
        out[f"reduce_scatter {tag}"] = torch.equal(mine, expected[rank * k:(rank + 1) * k])
        sent = x.clone()
        dist.broadcast(sent, src=0)
        out[f"broadcast {tag}"] = torch.equal(sent, part(0, k))
    return out


def _strategies(job: DistCheck, device: torch.device, rank: int, n: int) -> dict[str, dict]:
    """One AdamW step of each strategy against one step of single-process training."""
    import gc

    from lmperf.model.custom import build_model
    from lmperf.model.presets import ModelConfig
    from lmperf.questions.parallel import strategies
    from lmperf.questions.parallel.reference import compare, loss_of, train_reference
    from lmperf.runtime import device as dev

    def model() -> torch.nn.Module:  # the doctor's small reference LM, seeded alike
        dev.seed_all(SEED)
        return build_model(ModelConfig(**SHAPE, attention="naive")).to(device)

    gen = torch.Generator().manual_seed(SEED)
    tokens = torch.randint(0, SHAPE["vocab_size"], (n * BATCH, SHAPE["context_length"] + 1),
                           generator=gen)
    inputs, targets = tokens[:, :-1].to(device), tokens[:, 1:].to(device)  # (n b, T) each
    reference = train_reference(model(), lambda s: (inputs, targets), 1, LR,
                                device_type=device.type)
    mine = slice(rank * BATCH, (rank + 1) * BATCH)
    out: dict[str, dict] = {}
    for name in STRATEGIES:
        setup = strategies.build(name, model(), lr=LR, bucket_mb=0.01, compute_dtype="fp32",
                                 device=device)
        loss_of(setup.model(inputs[mine]), targets[mine]).backward()
        setup.sync()
        setup.optimizer.step()
        full = setup.full_params()
        out[name] = compare(full, reference, 1e-5, 1e-4)  # `lmperf dist train`'s fp32 bound
        setup.close()
        del setup, full
        gc.collect()  # nothing of one strategy (hooks, gloo work) may outlive it
    return out


def _memory_cap(job: DistCheck, device: torch.device, local_rank: int) -> dict:
    """Under the job's cap: a small allocation fits on this rank's GPU, CAP_GIB + 1 GiB does not."""
    from lmperf.core.outcome import first_line
    from lmperf.runtime import device as dev

    index = dev.cuda_index(device)
    small_ok, big_oom, message = False, False, ""
    try:
        small = torch.ones(64 * MIB, dtype=torch.uint8, device=device)
        small_ok = True
        big = torch.empty(int((job.max_memory_gib + 1) * GIB), dtype=torch.uint8, device=device)
        big.fill_(1)
        message = f"allocated {job.max_memory_gib + 1:g} GiB on cuda:{index} under the cap"
        del big
    except Exception as exc:  # noqa: BLE001 - out of memory is what is expected here
        big_oom = small_ok and dev.is_oom(exc)
        message = first_line(exc)[:160]
    finally:
        dev.free_memory(device)
    return {"device_index": index, "local_rank": local_rank, "small_ok": small_ok,
            "big_oom": big_oom, "message": message}


def run_item(job: DistCheck, item: str, ctx) -> dict | None:
    """Run `item` on this rank; rank 0 returns every rank's answers as the record's metrics."""
    import torch.distributed as dist

    ctx.stage.now = f"doctor: {item}"
    if item == "collectives":
        mine: object = _collectives(ctx.device, ctx.rank, ctx.world_size)
    elif item == "strategies":
        mine = _strategies(job, ctx.device, ctx.rank, ctx.world_size)
    elif item == "memory-cap":
        mine = _memory_cap(job, ctx.device, ctx.local_rank)
    else:
        raise ValueError(f"unknown doctor item {item!r}")
    gathered = [None] * ctx.world_size if ctx.rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    if ctx.rank != 0:
        return None
    return {"metrics": {"ranks": gathered}}


# --- in the doctor ------------------------------------------------------------------------------

def plan(device: torch.device) -> DistCheck | str:
    """The job for `device`, or why none can run (CUDA needs 2+ GPUs, NCCL and fully_shard)."""
    import torch.distributed as dist

    from lmperf.runtime import device as dev

    if not dist.is_available():
        return "this torch was built without torch.distributed"
    if device.type == "cpu":
        return DistCheck(world_size=2, checks=("collectives", "strategies"))
    gpus = dev.cuda_device_count()
    if gpus < 2:
        return f"needs 2 or more GPUs (this machine has {gpus}): one NCCL rank per GPU"
    if not dist.is_nccl_available():
        return "this torch was built without NCCL"
    return DistCheck(world_size=gpus, checks=("collectives", "strategies", "memory-cap"),
                     backend="nccl", device="cuda", max_memory_gib=CAP_GIB)


def start(ctx: Context) -> Callable[[], dict[str, dict] | str]:
    """The launch: run the job (seconds to start 2 ranks that import torch); returns {item:
    record}, or the reason it cannot run."""
    job = plan(ctx.device)

    def run() -> dict[str, dict] | str:
        if isinstance(job, str):
            return job
        from lmperf.core.torchrun import run_job

        return {r["spec"]["item"]: r for r in run_job(job)}

    return run


def _record(ctx: Context, item: str) -> dict | Outcome:
    """`item`'s record from this job's launch (run by the first check that asks, shared by the
    others), or the Outcome that replaces it."""
    answer = ctx.result_of(start)
    if isinstance(answer, str):
        return skip(answer)
    record = answer.get(item)
    if record is None or record.get("status") != "ok":
        message = (record or {}).get("message", "no record came back")
        return fail(f"{(record or {}).get('status', 'missing')}: {str(message)[:140]}",
                    f"the {item} item must run on every rank")
    return record


def check_collectives(ctx: Context) -> Outcome:
    """Every collective on every rank equal to the locally computed answer."""
    record = _record(ctx, "collectives")
    if isinstance(record, Outcome):
        return record
    ranks = record["metrics"]["ranks"]
    wrong = sorted({f"{c} (rank {r})" for r, got in enumerate(ranks) for c, ok in got.items()
                    if not ok})
    env = record.get("env") or {}
    nccl = env.get("nccl")  # where the environment capture records it
    result = (f"{len(ranks)} ranks ({env.get('backend', '?')}{f' {nccl}' if nccl else ''}): "
              f"{len(ranks[0])} collective x size pairs, "
              + (f"{len(wrong)} wrong: {', '.join(wrong)[:120]}" if wrong else "all exact"))
    return passed(not wrong, result, "integer-valued inputs: every answer must be exactly the "
                                     "reference's (torch.equal)", wrong=wrong, nccl=nccl)


def check_strategies(ctx: Context) -> Outcome:
    """One step of each readable strategy against single-process training on the global batch."""
    record = _record(ctx, "strategies")
    if isinstance(record, Outcome):
        return record
    rank0 = record["metrics"]["ranks"][0]
    bad = [s for s, r in rank0.items() if not r["equal"]]
    worst = max(rank0, key=lambda s: rank0[s]["max_abs_diff"])
    result = (f"{len(rank0)} strategies x 1 AdamW step: max |diff| {rank0[worst]['max_abs_diff']:.1e}"
              f" ({worst})")
    if bad:
        result = f"beyond the bound: {', '.join(bad)}; " + result
    return passed(not bad, result,
                  "within 1e-5 + 1e-4|ref| of one process (`dist train`'s fp32 bound)",
                  per_strategy={s: r["max_abs_diff"] for s, r in rank0.items()})


def check_memory_cap(ctx: Context) -> Outcome:
    """`lmperf dist --max-memory-gib` on every rank: each rank's own GPU is capped."""
    record = _record(ctx, "memory-cap")
    if isinstance(record, Outcome):
        return record
    ranks = record["metrics"]["ranks"]
    wrong = [f"rank {r}: cuda:{x['device_index']} small {'ok' if x['small_ok'] else 'failed'}, "
             f"{'oom' if x['big_oom'] else x['message'][:60]}"
             for r, x in enumerate(ranks)
             if not (x["small_ok"] and x["big_oom"] and x["device_index"] == x["local_rank"])]
    result = (f"{len(ranks)} ranks capped at {CAP_GIB:g} GiB: "
              + ("each ran out of memory on its own GPU" if not wrong else "; ".join(wrong)[:140]))
    return passed(not wrong, result, f"a {CAP_GIB + 1:g} GiB allocation must fail on every "
                                     "rank's own device, 64 MiB must fit", ranks=ranks)
