"""The rank side of a torchrun job: `python -m lmperf.core.rank JOB.json` on every rank, and the
spec parts every torchrun job shares (`Ranks`, `RankJob`).

Each rank joins the process group, runs the job's items in order (the job's `worker` function,
on every rank; rank 0 gets the item's payload back and turns it into a record), and leaves
cleanly. For the launcher (`lmperf.core.torchrun`) it writes into the folder named by
$LMPERF_DIST_DIR:

- `rank_R.log`: the rank's stdout and stderr (and a Python traceback on a fatal signal);
- `rank_R.state.json`: pid, item, stage, a counter of stage changes and whether the stage waits
  in a collective, rewritten at every stage, so that the launcher can name the late rank;
- `rank_R.fail.json`: the rank's failure (oom / error, message, traceback) when an item raised;
  the rank then exits at once with code 1 (its peers would otherwise wait in a collective);
- `records.jsonl` (rank 0): one record per finished item, appended as it finishes;
- `rank_R.exit.json`: written after `destroy_process_group()` returned.

Exiting cleanly is a rule, not luck: gloo work still in flight at exit aborts with "terminate
called without an active exception", so every item releases its wrapper and optimizer, and
`shutdown` collects garbage, meets the other ranks at a barrier and destroys the process group.
"""

from __future__ import annotations

import faulthandler
import gc
import json
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from lmperf.errors import LmperfError, SpecError
from lmperf.names import DEVICES
from lmperf.results.schema import SpecDict
from lmperf.validate import check_fields

if TYPE_CHECKING:
    import torch

ENV_DIR = "LMPERF_DIST_DIR"
ENV_FAULT = "LMPERF_DIST_FAULT"  # tests: "crash|hang|raise@RANK@ITEM,..." (see `_inject_fault`)


BACKENDS: tuple[str, ...] = ("gloo", "nccl")
DEFAULT_TIMEOUT_S = 300.0  # per item: a rank that hangs is killed after this, never waited on


@dataclass(frozen=True, kw_only=True)
class Ranks:
    """How a job's ranks run, shared by every torchrun job (dist's, the doctor's): how many, the
    process group's backend, the device, torch's threads per rank, and two launch options:
    `timeout_s` (an item running longer is killed: an error row) and `max_memory_gib` (each
    rank's memory cap, so that a rank that does not fit is an 'oom' row; 0: none)."""

    world_size: int
    backend: str = "gloo"
    device: str = "cpu"
    threads: int = 1
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_memory_gib: float = 0.0

    def check_ranks(self) -> None:
        """SpecError for a bad backend, device, thread count, timeout or world size."""
        check_fields(self, choices={"backend": BACKENDS, "device": DEVICES},
                     positive=("world_size",), non_negative=("threads",))
        if self.backend == "nccl" and self.device != "cuda":
            raise SpecError("the nccl backend needs --device cuda")
        timeout = self.timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise SpecError(f"timeout must be a positive number of seconds, got {timeout!r}")


class RankJob(SpecDict):
    """What every torchrun job shares: the dict round trip without launch fields (a job also has
    `items()`, `item_spec(item)`, `with_items(items)`, `kind`, `runner` and `worker`)."""

    # how a job is launched, not what it measures: not part of a record's identity
    not_identity = ("timeout_s", "max_memory_gib")


class Progress:
    """The rank's current stage (the `Stage` shape of lmperf.core.outcome: `.now`), mirrored to
    its state file on every change so the launcher can tell where each rank stopped."""

    def __init__(self, path: Path | None, rank: int):
        self._path, self._rank = path, rank
        self.item, self.index, self.seq = "", -1, 0
        self._now = "starting"

    @property
    def now(self) -> str:
        return self._now

    @now.setter
    def now(self, stage: str) -> None:
        self._set(stage, waiting=False)

    def wait(self, stage: str) -> None:
        """Enter `stage`, a collective this rank waits in for its peers: when an item times
        out, a rank still working is the late one, not a rank waiting here (the launcher)."""
        self._set(stage, waiting=True)

    def _set(self, stage: str, waiting: bool) -> None:
        self._now = stage
        self.seq += 1
        if self._path is None:
            return
        state = {"rank": self._rank, "pid": os.getpid(), "item": self.item, "index": self.index,
                 "stage": stage, "seq": self.seq, "time": time.time(), "waiting": waiting}
        tmp = self._path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state), encoding="utf-8")
        os.replace(tmp, self._path)

    def begin(self, index: int, item: str) -> None:
        """Start item number `index`."""
        self.item, self.index = item, index
        self.now = f"starting {item}"


@dataclass
class RankContext:
    """What an item function needs to know about its rank (nnodes: distinct torchrun agents;
    folder: the launcher's, None when a user started torchrun; stage: the progress)."""

    rank: int
    world_size: int
    local_rank: int
    device: object
    backend: str
    nnodes: int
    folder: Path | None
    stage: Progress
    hosts: list[str] = field(default_factory=list)


def _redirect_output(folder: Path, rank: int) -> None:
    """Send this rank's stdout/stderr (file descriptors 1 and 2, so C++ messages too) to its log."""
    fd = os.open(folder / f"rank_{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def rank_device(job: object, local_rank: int) -> torch.device:
    """This rank's device, made current, then capped when the job has `max_memory_gib` (in
    that order: capping an index-less "cuda" first capped GPU 0 on every rank; NCCL also needs
    the device set before its first use)."""
    import torch

    from lmperf.runtime.device import cap_memory, use_cuda_device

    device = torch.device(job.device)  # type: ignore[attr-defined]
    if device.type == "cuda":  # one GPU per local rank
        device = use_cuda_device(local_rank)
    if getattr(job, "max_memory_gib", None):  # a rank that does not fit fails as 'oom'
        cap_memory(device, job.max_memory_gib)  # type: ignore[attr-defined]
    return device


def setup(job: object, folder: Path | None) -> RankContext:
    """Join the process group of torchrun's environment; threads, device and logs per rank."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if folder is not None:
        _redirect_output(folder, rank)
    faulthandler.enable()  # a fatal signal leaves the Python stack in the rank's log
    progress = Progress(folder / f"rank_{rank}.state.json" if folder else None, rank)
    progress.now = "importing torch"
    import torch
    import torch.distributed as dist

    if getattr(job, "threads", 0):
        torch.set_num_threads(job.threads)  # type: ignore[attr-defined]
    try:
        device = rank_device(job, local_rank)
    except LmperfError as exc:  # e.g. a memory cap under what the rank maps: its own account
        fields = {"status": "error", "message": str(exc), "rank": rank, "item": None,
                  "stage": "capping memory"}
        print(f"lmperf: rank {rank}: {exc}", file=sys.stderr, flush=True)
        if folder is not None:
            (folder / f"rank_{rank}.fail.json").write_text(json.dumps(fields))
        os._exit(1)
    # Everything imported so far lives as long as the process: keep it out of the collector, so
    # that the gc.collect() releasing each strategy scans only what the items create (~0.4 s
    # less per collection with torch loaded).
    gc.freeze()
    progress.now = "joining the process group"
    # Under lmperf's launcher its watchdog kills a hung item after timeout_s and names the rank
    # that stopped; the collectives' own timeout comes later so that it does not pre-empt it
    # (a rank timing out in a collective only says that it waited). Under a user's torchrun the
    # collectives' timeout is the only one.
    timeout = job.timeout_s * (2 if folder is not None else 1) + (30 if folder is not None else 0)  # type: ignore[attr-defined]
    dist.init_process_group(job.backend, timeout=timedelta(seconds=timeout))  # type: ignore[attr-defined]
    if dist.get_world_size() != job.world_size:  # type: ignore[attr-defined]
        raise RuntimeError(f"torchrun started {dist.get_world_size()} ranks but the job is for "
                           f"{job.world_size}")  # type: ignore[attr-defined]
    # Nodes are torchrun agents (GROUP_RANK), not host names: two agents on one host are two
    # "nodes" of a rendezvous, which is how the multi-node path is tested on one machine.
    places = [None] * world
    dist.all_gather_object(places, (os.environ.get("GROUP_RANK", "0"), socket.gethostname()))
    progress.now = "ready"
    return RankContext(rank, world, local_rank, device, job.backend,  # type: ignore[attr-defined]
                       len({g for g, _ in places}), folder, progress,
                       sorted({h for _, h in places}))


def shutdown(ctx: RankContext) -> None:
    """Leave cleanly: collect garbage (wrappers holding gloo work), barrier, destroy the group."""
    import torch.distributed as dist

    ctx.stage.now = "shutting down"
    gc.collect()
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    if ctx.folder is not None:
        (ctx.folder / f"rank_{ctx.rank}.exit.json").write_text(json.dumps({"clean": True}))


def environment(ctx: RankContext) -> dict:
    """The record's `env`: lmperf's capture plus what the process group looked like."""
    import torch

    from lmperf.runtime import env

    captured = env.capture(ctx.device)  # type: ignore[arg-type]
    captured.update(backend=ctx.backend, world_size=ctx.world_size, nnodes=ctx.nnodes,
                    hosts=ctx.hosts, torch_threads=torch.get_num_threads(),
                    launched_by="lmperf" if ctx.folder else "torchrun")
    return captured


def run_items(job: object, items: list[str], ctx: RankContext,
              sink: Callable[[dict], None]) -> None:
    """Run every item on this rank; rank 0 passes each item's record to `sink`.

    A rank whose item raises writes its failure (rank_R.fail.json) and exits with code 1 at
    once: the other ranks are then stopped by torchrun, and the launcher makes the error row.
    """
    from lmperf.core.jobs import resolve
    from lmperf.core.outcome import failure
    from lmperf.results.schema import make_record

    item_fn = resolve(job.worker)  # type: ignore[attr-defined]
    env = environment(ctx) if ctx.rank == 0 else {}
    for index, item in enumerate(items):
        ctx.stage.begin(index, item)
        try:
            _inject_fault(ctx, item)
            payload = item_fn(job, item, ctx)
        except Exception as exc:  # this rank cannot go on; its peers would wait forever
            fields = failure(exc, ctx.stage.now)
            _fail(ctx, item, fields)
        if ctx.rank == 0 and payload is not None:
            spec = job.item_spec(item)  # type: ignore[attr-defined]
            sink(make_record(job.kind, spec, payload.pop("status", "ok"), env, **payload))


def _fail(ctx: RankContext, item: str, fields: dict) -> None:
    """Record this rank's failure where the launcher looks, print it, and exit now."""
    fields = {**fields, "rank": ctx.rank, "item": item, "stage": ctx.stage.now}
    print(f"lmperf: rank {ctx.rank} failed in {item}: {fields['message']}", file=sys.stderr)
    print(fields.get("traceback", ""), file=sys.stderr)
    if ctx.folder is not None:
        (ctx.folder / f"rank_{ctx.rank}.fail.json").write_text(json.dumps(fields))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)  # not sys.exit: no clean-up that would wait on peers stuck in a collective


def _inject_fault(ctx: RankContext, item: str) -> None:
    """For the launcher's tests: $LMPERF_DIST_FAULT="KIND@RANK@ITEM[,...]" makes rank RANK
    crash (SIGSEGV), hang (sleep) or raise when it starts ITEM. Nothing happens without it."""
    faults = [f.split("@", 2) for f in os.environ.get(ENV_FAULT, "").split(",") if f]
    kind = next((k for k, rank, target in faults if int(rank) == ctx.rank and target == item), None)
    if kind is None:
        return
    ctx.stage.now = f"injected {kind}"
    if kind == "crash":
        import signal

        os.kill(os.getpid(), signal.SIGSEGV)
    elif kind == "hang":
        time.sleep(3600)
    elif kind == "raise":
        raise RuntimeError("injected failure")


def main(argv: list[str] | None = None) -> int:
    """Entry point under torchrun: read the job, run its items, leave cleanly."""
    argv = sys.argv[1:] if argv is None else argv
    from lmperf.core.jobs import resolve

    job_file = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    job = resolve(job_file["spec_class"]).from_dict(job_file["spec"])
    folder = Path(os.environ[ENV_DIR]) if os.environ.get(ENV_DIR) else None
    ctx = setup(job, folder)
    records_path = folder / "records.jsonl" if folder else None

    def sink(record: dict) -> None:
        from lmperf.results.schema import to_jsonable

        assert records_path is not None
        with open(records_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(to_jsonable(record), allow_nan=False) + "\n")

    run_items(job, job_file["items"], ctx, sink)
    shutdown(ctx)
    return 0


if __name__ == "__main__":
    sys.exit(main())
