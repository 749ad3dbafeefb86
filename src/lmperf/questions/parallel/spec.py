"""The jobs of `lmperf dist`: one torchrun launch per (command, world size), several records each.

A job (`CommJob`, `TrainJob`) runs all collectives and sizes, or all strategies, at one world
size in one launch (starting one costs ~3 s of imports per rank on a 2-core machine); each
finished item is one record with the item's own `spec` (`item_spec`), so tables and `--resume`
see one row per item. `runner` starts torchrun (`lmperf.core.torchrun`), `worker` runs an item
on every rank (`lmperf.core.rank`'s protocol).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from lmperf.core.rank import RankJob, Ranks
from lmperf.questions.parallel.items import check as check_item, parse as parse_item
from lmperf.errors import SpecError
from lmperf.kernels import NAMES as ATTENTION
from lmperf.model.shape import ModelShape
from lmperf.validate import check_fields, checkpoint_policy, choice, positive_int

COLLECTIVES: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                "all_to_all")
STRATEGIES: tuple[str, ...] = ("single", "naive", "flat", "overlap", "bucketed", "torch-ddp",
                               "fsdp2", "zero1", "torch-zero1", "torch-zero2")
SHARDED: tuple[str, ...] = ("fsdp2", "torch-zero2")  # they take --compute-dtype
PRECISIONS: tuple[str, ...] = ("fp32", "bf16-mixed")
DTYPES: tuple[str, ...] = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class CommJob(RankJob, Ranks):
    """Collective benchmarks at one world size: every collective x every size (bytes S, as
    nccl-tests defines S: the whole array, see `lmperf.questions.parallel.comm`), `warmup`
    untimed then `iters` timed iterations each; the ranks: see `Ranks`."""

    kind: ClassVar[str] = "dist"
    what: ClassVar[str] = "comm"
    runner: ClassVar[str] = "lmperf.core.torchrun:run_job"
    worker: ClassVar[str] = "lmperf.questions.parallel.comm:run_item"

    collectives: tuple[str, ...] = COLLECTIVES
    sizes: tuple[int, ...] = (1024,)
    dtype: str = "fp32"
    warmup: int = 5
    iters: int = 20

    def __post_init__(self) -> None:
        self.check_ranks()
        check_fields(self, choices={"dtype": DTYPES}, positive=("iters",),
                     non_negative=("warmup",))
        if not self.collectives or not self.sizes:
            raise SpecError("a comm job needs at least one collective and one size")
        for name in self.collectives:
            choice("collective", name, COLLECTIVES)
        for size in self.sizes:
            positive_int("size (bytes)", size)

    def items(self) -> list[str]:
        """'collective:bytes' for every pair, collective-major."""
        return [f"{c}:{s}" for c in self.collectives for s in self.sizes]

    def item_spec(self, item: str) -> dict:
        """The record spec of one item."""
        collective, size = item.split(":")
        base = {k: v for k, v in self.to_dict().items() if k not in ("collectives", "sizes")}
        return {"what": "comm", "collective": collective, "size_bytes": int(size), **base}

    def with_items(self, items: list[str]) -> "CommJob":
        """Only the collectives and sizes that `items` name (their cartesian product)."""
        pairs = [i.split(":") for i in items]
        cols = tuple(dict.fromkeys(c for c, _ in pairs))
        sizes = tuple(dict.fromkeys(int(s) for _, s in pairs))
        return CommJob(**{**self.to_full_dict(), "collectives": cols, "sizes": sizes})

    def label(self) -> str:
        """Short name for progress lines."""
        return f"comm n={self.world_size} {self.backend} {self.dtype} ({len(self.items())} items)"


@dataclass(frozen=True, kw_only=True)
class StrategyOptions:
    """How the strategies of a train job are set up: `bucket_mb` (MiB) of 'bucketed',
    'torch-ddp', 'zero1' and 'torch-zero1'; `compute_dtype` (and communication dtype) of the
    SHARDED ones."""

    bucket_mb: float = 1.0
    compute_dtype: str = "fp32"

    def check_strategy_options(self) -> None:
        """SpecError for an unknown dtype or a non-positive bucket size."""
        check_fields(self, choices={"compute_dtype": DTYPES})
        value = self.bucket_mb
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise SpecError(f"bucket_mb must be a positive number, got {value!r}")


@dataclass(frozen=True)
class TrainJob(RankJob, StrategyOptions, ModelShape, Ranks):
    """Data-parallel training strategies, and layouts (TP, PP, HSDP: `items.Item`, an item
    string such as 'fsdp2 tp=2'), at one world size, on the same model and data.

    Each data-parallel replica (a rank, without a layout) trains on `grad_accum` micro-batches
    of `batch` sequences of its own per step (the global batch is replicas x grad_accum x
    batch; a pipeline splits `batch` into its micro-batches); 'single' runs at world size 1
    only.
    `warmup`, `steps`: untimed, then timed steps; `profile_steps`: further steps under the
    profiler (communication intervals and bytes); `precision`: 'fp32' or 'bf16-mixed' (bf16
    autocast over fp32 weights); `checkpoint`: the activation checkpointing policy, canonical
    (none, full, op, every-K or G blocks per group: lmperf.validate.checkpoint_policy);
    `reference`: check the trained parameters against one process on the
    global batch (False: for a model one device cannot hold).
    """

    kind: ClassVar[str] = "dist"
    what: ClassVar[str] = "train"
    runner: ClassVar[str] = "lmperf.core.torchrun:run_job"
    worker: ClassVar[str] = "lmperf.questions.parallel.train:run_item"

    # size, d_model, num_layers, num_heads, d_ff, course: ModelShape; world_size and the
    # launch: Ranks; bucket_mb, compute_dtype: StrategyOptions
    strategies: tuple[str, ...]
    vocab_size: int
    context: int = 64
    batch: int = 4
    warmup: int = 2
    steps: int = 5
    profile_steps: int = 2
    lr: float = 1e-3
    seed: int = 0
    attention: str = "naive"
    precision: str = "fp32"
    checkpoint: str | int = "none"
    grad_accum: int = 1
    reference: bool = True

    def __post_init__(self) -> None:
        self.check_shape()
        self.check_ranks()
        self.check_strategy_options()
        check_fields(self, choices={"precision": PRECISIONS, "attention": ATTENTION},
                     positive=("vocab_size", "context", "batch", "steps", "grad_accum"),
                     non_negative=("warmup", "profile_steps"))
        object.__setattr__(self, "checkpoint", checkpoint_policy(self.checkpoint))
        if not self.strategies:
            raise SpecError("a train job needs at least one strategy")
        for name in self.strategies:
            item = parse_item(name, self.world_size)
            if item.is_layout:
                check_item(item, num_layers=self.num_layers, num_heads=self.num_heads,
                           context=self.context, batch=self.batch, grad_accum=self.grad_accum,
                           checkpoint=self.checkpoint, compute_dtype=self.compute_dtype,
                           device=self.device)
                continue
            choice("strategy", name, STRATEGIES)
            if (name == "single") != (self.world_size == 1):
                raise SpecError("strategy 'single' runs at world size 1 and only it does "
                                f"(got {name!r} at world size {self.world_size})")
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or self.lr <= 0:
            raise SpecError(f"lr must be a positive number, got {self.lr!r}")

    def items(self) -> list[str]:
        """The strategies, in order."""
        return list(self.strategies)

    def item_spec(self, item: str) -> dict:
        """The record spec of one item: its strategy and, for a layout, the layout's degrees."""
        base = {k: v for k, v in self.to_dict().items() if k != "strategies"}
        parsed = parse_item(item, self.world_size)
        return {"what": "train", "strategy": parsed.strategy, **base, **parsed.spec_fields()}

    def with_items(self, items: list[str]) -> "TrainJob":
        """Only the strategies in `items`."""
        return TrainJob(**{**self.to_full_dict(), "strategies": tuple(items)})

    def label(self) -> str:
        """Short name for progress lines."""
        return (f"train n={self.world_size} {self.size} b={self.batch}"
                + (f"x{self.grad_accum}" if self.grad_accum > 1 else "")
                + f" ctx={self.context} {','.join(self.strategies)}")
