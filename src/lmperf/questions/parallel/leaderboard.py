"""`lmperf dist leaderboard`: the 2026 course leaderboard's measurement, on `lmperf dist train`'s
machinery: one full training step of the `leaderboard` preset at context 32,768, global batch 2
on two GPUs, under FSDP2 with every block checkpointed, timed as `triton.testing.do_bench` times
a call, the slowest rank's per repetition, and the cold start (docs/commands/dist.md). On the
CPU the same path runs with gloo on a scaled-down model (the tests).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ClassVar

from lmperf.errors import SpecError
from lmperf.model.shape import ModelShape
from lmperf.core.rank import Ranks
from lmperf.results.schema import SpecDict
from lmperf.validate import check_fields

if TYPE_CHECKING:
    import argparse

    from lmperf.core.report import Report

PRECISIONS: tuple[str, ...] = ("bf16-mixed", "bf16-true")
ESTIMATE_CALLS = 5  # do_bench's: calls timed to estimate one call before choosing the counts
DEFAULT_OUT = Path("results") / "leaderboard.jsonl"
COLD_START_BUDGET_S = 600.0


@dataclass(frozen=True)
class LeaderboardJob(SpecDict, ModelShape, Ranks):
    """One leaderboard measurement (one item) at one world size.

    batch is the GLOBAL batch (sequences per step over all ranks; each of n ranks trains on
    batch / n); precision: 'bf16-true' (states in bf16) or 'bf16-mixed' (fp32 master weights,
    bf16 compute); warmup_ms, rep_ms: do_bench's budgets (ms); the rest as `lmperf dist train`'s
    jobs (`Ranks`, `ModelShape`).
    """

    kind: ClassVar[str] = "dist"
    what: ClassVar[str] = "leaderboard"
    runner: ClassVar[str] = "lmperf.core.torchrun:run_job"
    worker: ClassVar[str] = "lmperf.questions.parallel.leaderboard:run_item"

    # size, d_model, num_layers, num_heads, d_ff, course: ModelShape; world_size, threads and
    # the memory cap: Ranks, whose defaults this job changes to the leaderboard's own
    backend: str = field(default="nccl", kw_only=True)
    device: str = field(default="cuda", kw_only=True)
    timeout_s: float = field(default=1800.0, kw_only=True)
    vocab_size: int
    context: int = 32768
    batch: int = 2
    precision: str = "bf16-true"
    checkpointing: bool = True
    attention: str = "sdpa"
    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    lr: float = 1e-4
    seed: int = 0

    def __post_init__(self) -> None:
        self.check_ranks()
        self.check_shape()
        if self.precision not in PRECISIONS:
            raise SpecError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        check_fields(self, positive=("context", "batch"))
        if self.batch % self.world_size:
            raise SpecError(f"the global batch ({self.batch}) must split evenly over "
                            f"{self.world_size} ranks")
        for name in ("warmup_ms", "rep_ms"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise SpecError(f"{name} must be a non-negative number of milliseconds, got {value!r}")

    def items(self) -> list[str]:
        """One item: the step."""
        return ["step"]

    def item_spec(self, item: str) -> dict:
        """The record spec."""
        return {"what": self.what, **self.to_dict()}

    def with_items(self, items: list[str]) -> "LeaderboardJob":
        """The same job (it has one item)."""
        return self

    def label(self) -> str:
        """Short name for progress lines."""
        return (f"leaderboard n={self.world_size} {self.size} ctx={self.context} "
                f"b={self.batch} {self.precision}")


def do_bench(fn: Callable[[], object], sync: Callable[[], None], warmup_ms: float,
             rep_ms: float, clock: Callable[[], float] = time.perf_counter) -> dict:
    """Time `fn` as `triton.testing.do_bench` does, with the host clock: one untimed call,
    ESTIMATE_CALLS calls to estimate its time, then max(1, warmup_ms / estimate) warm-up calls
    and max(1, rep_ms / estimate) timed calls, `sync()` after each. Returns {'estimate_ms',
    'n_warmup', 'n_rep', 'times_ms': each timed call's wall milliseconds}."""
    fn()
    sync()
    begin = clock()
    for _ in range(ESTIMATE_CALLS):
        fn()
    sync()
    estimate_ms = (clock() - begin) * 1e3 / ESTIMATE_CALLS
    n_warmup = max(1, int(warmup_ms / estimate_ms)) if estimate_ms > 0 else 1
    n_rep = max(1, int(rep_ms / estimate_ms)) if estimate_ms > 0 else 1
    for _ in range(n_warmup):
        fn()
    sync()
    times = []
    for _ in range(n_rep):
        begin = clock()
        fn()
        sync()
        times.append((clock() - begin) * 1e3)
    return {"estimate_ms": estimate_ms, "n_warmup": n_warmup, "n_rep": n_rep, "times_ms": times}


def _setup(job: LeaderboardJob, device):
    """The model on `device` (built there: no host copy of 8 B parameters), checkpointed and
    wrapped by fully_shard, with its optimizer: a `strategies.Setup`."""
    import torch

    from lmperf.model.custom import build_model
    from lmperf.model.presets import ModelConfig
    from lmperf.questions.parallel import strategies
    from lmperf.runtime import device as dev

    dev.seed_all(job.seed)
    config = ModelConfig(vocab_size=job.vocab_size, context_length=job.context,
                         d_model=job.d_model, num_layers=job.num_layers, num_heads=job.num_heads,
                         d_ff=job.d_ff, attention=job.attention)
    with device:  # parameters are created on the device, not copied there
        model = build_model(config)
    if job.checkpointing:
        model.set_checkpointing("full")  # every block recomputed in backward: only its input kept
    if job.precision == "bf16-true":
        model = model.to(torch.bfloat16)
    compute = "bf16" if job.precision == "bf16-mixed" else "fp32"  # bf16-true: nothing to cast
    return strategies.build("fsdp2", model, lr=job.lr, bucket_mb=1.0, compute_dtype=compute,
                            device=device)


def run_item(job: LeaderboardJob, item: str, ctx) -> dict | None:
    """Build, shard, step and time on this rank; rank 0 returns the record's fields."""
    import torch
    import torch.distributed as dist

    from lmperf.measure.stats import summarize
    from lmperf.measure.throughput import tokens_per_s
    from lmperf.questions.parallel.train import _no_range, train_step
    from lmperf.runtime import device as dev
    from lmperf.workload.steps import NO_OBSERVER

    device, n, rank = ctx.device, ctx.world_size, ctx.rank
    ctx.stage.now = "building and sharding the model"
    setup = _setup(job, device)
    b = job.batch // n
    gen = torch.Generator().manual_seed(job.seed)
    tokens = torch.randint(0, job.vocab_size, (job.batch, job.context + 1),
                           generator=gen)[rank * b:(rank + 1) * b].to(device)  # (b, T + 1)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    peak = dev.PeakMemory(device)
    peak.reset()
    ctx.stage.now = "timing steps (do_bench style)"
    first: list[float] = []  # when the first step's work had finished (its first sync)

    def sync() -> None:
        dev.synchronize(device)
        if not first:
            first.append(time.time())

    timing = do_bench(lambda: train_step(setup, inputs, targets, NO_OBSERVER, _no_range), sync,
                      job.warmup_ms, job.rep_ms)
    mine = {"times_ms": timing["times_ms"], "peak": peak.read(), "peak_kind": peak.kind,
            "cold_start_s": first[0] - _process_start()}
    setup.close()
    gathered = [None] * n if rank == 0 else None
    dist.gather_object({**timing, **mine}, gathered, dst=0)
    if rank != 0:
        return None
    per_rep = [max(col) for col in zip(*(r["times_ms"] for r in gathered))]  # slowest rank
    step_ms = summarize(per_rep)
    tokens_per_step = job.batch * job.context
    cold = max(r["cold_start_s"] for r in gathered)
    metrics = {"step_ms": step_ms, "timer": "host clock after device synchronize, per step",
               "estimate_ms": timing["estimate_ms"], "n_warmup": timing["n_warmup"],
               "n_rep": timing["n_rep"], "per_rank_times_ms": [r["times_ms"] for r in gathered],
               "tokens_per_step": tokens_per_step,
               "tokens_per_s": tokens_per_s(tokens_per_step, step_ms),
               "cold_start_s": cold, "peak_memory": [r["peak"] for r in gathered],
               "peak_kind": gathered[0]["peak_kind"]}
    warnings = []
    if cold > COLD_START_BUDGET_S:
        warnings.append(f"cold start {cold:.0f} s: over the leaderboard's {COLD_START_BUDGET_S:.0f} s")
    params = sum(p.numel() for p in setup.model.parameters())  # a DTensor's numel is global
    return {"metrics": metrics, "warnings": warnings, "params": params}


def _process_start() -> float:
    """When this process started (seconds since the epoch), from /proc; now where unavailable."""
    try:
        ticks = int(Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


# --- the command --------------------------------------------------------------------------------

def plan(size: str = "leaderboard", *, world_size: int | None = None, context: int = 32768,
         batch: int = 2, precision: str = "bf16-true", checkpointing: bool = True,
         attention: str = "sdpa", warmup_ms: float = 25.0, rep_ms: float = 100.0,
         vocab_size: int | None = None, device: str = "auto", course: str = "2026",
         timeout: float | None = None, max_memory_gib: float | None = None,
         seed: int = 0) -> LeaderboardJob:
    """The job: the preset's shape, NCCL with one rank per GPU on CUDA (default 2), gloo with 2
    ranks on the CPU. Raises SpecError for bad input."""
    from lmperf.runtime import device as dev

    dims = ModelShape.of_size(size, course)  # and the preset's own vocabulary, if it has one
    resolved = dev.resolve_device(device)
    n = world_size if world_size is not None else 2
    if resolved.type == "cuda" and dev.cuda_device_count() < n:
        raise SpecError(f"{n} ranks need {n} GPUs; this machine has {dev.cuda_device_count()}")
    return LeaderboardJob(
        world_size=n, size=size, **{**dims, "vocab_size": vocab_size or dims.get("vocab_size", 10_000)},
        context=context,
        batch=batch, precision=precision, checkpointing=checkpointing, attention=attention,
        warmup_ms=warmup_ms, rep_ms=rep_ms, course=course, seed=seed,
        backend="nccl" if resolved.type == "cuda" else "gloo", device=resolved.type,
        timeout_s=timeout or 1800.0, max_memory_gib=max_memory_gib or 0.0)


def leaderboard(size: str = "leaderboard", *, out: str | Path | None = None,
                **options: object) -> "Report":
    """Run the leaderboard step (see the module docstring and `plan` for the options) under
    torchrun and return its Report (one row); the record is appended to `out` when given. A
    rank that runs out of memory, crashes or hangs is a row naming the rank."""
    from lmperf.core.torchrun import run_job
    from lmperf.results import store

    job = plan(size, **options)  # type: ignore[arg-type]
    if out is not None:
        store.ensure_writable(Path(out))
    records = run_job(job)
    if out is not None:
        for record in records:
            store.append_record(Path(out), record)
    return build_report(records)


COLUMNS = ("world_size", "size", "context", "batch", "precision", "checkpointing", "status",
           "step_ms", "step_ms_min", "step_ms_max", "n_rep", "tokens_per_s", "peak_mib",
           "cold_start_s", "message")


def build_report(records: list[dict]) -> "Report":
    """One row per leaderboard record: the median step (ms, slowest rank per repetition), its
    range, the repetitions, tokens/s, the largest per-rank peak memory (MiB) and the cold start."""
    import pandas as pd

    from lmperf.core.report import Report

    rows = []
    for r in records:
        s, m = r["spec"], r.get("metrics") or {}
        step = m.get("step_ms") or {}
        peaks = [p.get("allocated") or p.get("rss") for p in m.get("peak_memory", []) if p]
        rows.append({"world_size": s["world_size"], "size": s["size"],
                     "context": s["context"], "batch": s["batch"],
                     "precision": s["precision"], "checkpointing": s["checkpointing"],
                     "status": r["status"], "step_ms": step.get("median"),
                     "step_ms_min": step.get("min"), "step_ms_max": step.get("max"),
                     "n_rep": m.get("n_rep"), "tokens_per_s": m.get("tokens_per_s"),
                     "peak_mib": max(peaks) if peaks else None,
                     "cold_start_s": m.get("cold_start_s"), "message": r.get("message", "")})
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    findings = [f"{row.world_size} ranks: {row.step_ms:.1f} ms per step (median of {row.n_rep}, "
                f"do_bench-style, slowest rank), cold start {row.cold_start_s:.0f} s"
                for row in frame.itertuples() if row.status == "ok"]
    return Report(kind="leaderboard", frame=frame, findings=findings, records=records,
                  title="leaderboard step (FSDP2 + activation checkpointing)")


# --- `lmperf dist leaderboard` (registered by questions/parallel/cli.py) --------------------------

def add_arguments(p: "argparse.ArgumentParser") -> None:
    """The leaderboard's own flags on `lmperf dist`'s parser (the shared ones are dist's)."""
    g = p.add_argument_group("leaderboard")
    g.add_argument("--precision", dest="lb_precision", choices=("fp32",) + PRECISIONS,
                   help="leaderboard: bf16-true (states in bf16, the default) or bf16-mixed (fp32 "
                        "master weights; 60.5 GiB of states per GPU on two); train: fp32 (the "
                        "default) or bf16-mixed (bf16 autocast over fp32 weights)")
    g.add_argument("--warmup-ms", type=float, default=25.0, metavar="MS",
                   help="leaderboard: do_bench's warm-up budget (default: 25)")
    g.add_argument("--rep-ms", type=float, default=100.0, metavar="MS",
                   help="leaderboard: do_bench's timed budget; at least one timed step (default: 100)")
    g.add_argument("--no-checkpointing", action="store_true",
                   help="leaderboard: keep every activation (default: checkpoint every block)")
    g.add_argument("--attention", dest="lb_attention",
                   help="the reference LM's attention (leaderboard default: sdpa; train: naive)")


def cmd(args: "argparse.Namespace", default_out: Path) -> int:
    """`lmperf dist leaderboard`: plan, launch, print the row; results/leaderboard.jsonl unless
    --out names another file."""
    from lmperf.core.command import run_command

    world = args.world_size
    if world is not None and len(world) != 1:
        raise SpecError("leaderboard runs at one world size (--world-size N)")
    out = DEFAULT_OUT if Path(args.out) == default_out else Path(args.out)
    options = dict(world_size=world[0] if world else None,
                   context=args.context or 32768, batch=args.batch or 2,
                   precision=args.lb_precision or "bf16-true",
                   checkpointing=not args.no_checkpointing,
                   attention=args.lb_attention or "sdpa", warmup_ms=args.warmup_ms, rep_ms=args.rep_ms,
                   vocab_size=args.vocab_size, device=args.device, course=args.course or "2026",
                   timeout=args.timeout, max_memory_gib=args.max_memory_gib, seed=args.seed)
    args.out = out
    return run_command(args, lambda: leaderboard(args.size or "leaderboard", out=out, **options),
                       noun="run")
