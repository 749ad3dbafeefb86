"""PlanSpec: one plan request (computed, not run: its records carry it and the candidate);
ConfirmJob: the cells `--confirm` runs on torchrun ranks, one item each; ConfirmAlone: one cell on
one device, forked as any job."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import ClassVar

from lmperf.errors import SpecError
from lmperf.names import ADAMW_ON
from lmperf.core.rank import RankJob, Ranks
from lmperf.validate import checkpoint_policy, positive_int

CUDA_PRECISIONS = ("bf16-mixed", "bf16-fsdp")
CPU_PRECISIONS = ("fp32", "bf16-mixed")
# The CPU plan's default: the CPU time model predicts bf16-mixed steps 1.5-2x too fast against
# fp32 ones (--confirm, docs/accuracy.md), so it ranks fp32 configurations unless asked
CPU_DEFAULT = ("fp32",)
RUNNABLE_ON_CPU = ("single", "ddp", "zero1", "fsdp")  # what --confirm can run here
# the layout dimensions a plan request may fix (core.vocabulary.LAYOUT; estimate.plan.Space)
LAYOUT_DIMENSIONS = ("tp", "pp", "cp", "dp_replicate", "pp_schedule", "pp_virtual",
                     "micro_batch", "async_tp", "compile", "float8")
OPTIMIZER = ADAMW_ON  # AdamW's as dist train runs it (strategies.ADAMW)
CONTEXT, GLOBAL_BATCH = 2048, 8  # the request's defaults (CLI and API alike)


@dataclass(frozen=True)
class PlanSpec:
    """One plan request. `size` of the `course` edition (or a `model` factory), `context`,
    `global_batch` sequences per step over all ranks; the target: `gpus` devices of `gpu` (None:
    the device at hand, `device`), `gpus_per_node` per node, `gib` per device (None: the GPU's
    memory); what is searched: `precisions`, `checkpoints` (checkpointing policies: none, full,
    op, every-K, G);
    `attention`; `host_us`: the host's time per op (None: the default); `searched`: the
    layout dimensions given, (flag name, values) pairs (the rest are searched over all their
    values: `estimate.plan.Space`); `node_bandwidth`: GB/s per GPU between nodes."""

    kind: ClassVar[str] = "plan"

    size: str | None
    context: int
    global_batch: int
    gpus: int
    course: str = "2026"
    model: str | None = None
    gpu: str | None = None
    device: str = "cuda"
    gpus_per_node: int = 8
    gib: float | None = None
    precisions: tuple[str, ...] = CUDA_PRECISIONS
    checkpoints: tuple[str | int, ...] = ("none", "op", "full")
    attention: str = "sdpa"
    host_us: float | None = None
    searched: tuple[tuple[str, tuple], ...] = ()
    node_bandwidth: float | None = None

    def __post_init__(self) -> None:
        from lmperf.core.vocabulary import check_target

        for name in ("context", "global_batch"):
            positive_int(name, getattr(self, name))
        check_target(gpus=self.gpus, gpus_per_node=self.gpus_per_node, gib=self.gib,
                     host_us=self.host_us)
        if self.device == "cpu" and self.gib is None:
            raise SpecError("a plan for the CPU needs a memory budget per rank: --gib G")
        if self.device == "cuda" and self.gpu is None and self.gib is None:
            raise SpecError("name the target GPU (--gpu NAME, e.g. H100-SXM) or give --gib")
        allowed = CPU_PRECISIONS if self.device == "cpu" else CUDA_PRECISIONS + ("fp32",)
        for p in self.precisions:
            if p not in allowed:
                raise SpecError(f"unknown plan precision {p!r} on {self.device}; accepted: "
                                f"{', '.join(allowed)}")
        object.__setattr__(self, "checkpoints", tuple(dict.fromkeys(
            checkpoint_policy(g) for g in self.checkpoints)))
        for name, values in self.searched:
            if name not in LAYOUT_DIMENSIONS:
                raise SpecError(f"unknown layout dimension {name!r}")
            if name in ("pp_schedule", "async_tp", "compile", "float8"):
                continue
            for v in values:
                positive_int(f"--{name.replace('_', '-')}", v)
        if self.node_bandwidth is not None and not (
                isinstance(self.node_bandwidth, (int, float)) and self.node_bandwidth > 0):
            raise SpecError(f"--node-bandwidth must be a positive number of GB/s, got "
                            f"{self.node_bandwidth!r}")

    def space(self):
        """What the search covers (`estimate.plan.Space`)."""
        from lmperf.estimate.plan import Space

        given = dict(self.searched)
        if self.device == "cpu":  # what this machine's ranks run unless the layout is given
            given = {"tp": (1,), "pp": (1,), "cp": (1,), "compile": (False,),
                     "float8": ("none",), "async_tp": (False,), **given}  # CUDA's own
        return Space(self.precisions, self.checkpoints,
                     RUNNABLE_ON_CPU if self.device == "cpu" else None, **given)

    def to_dict(self) -> dict:
        """JSON-ready identity (every record's spec starts with it); the layout dimensions given
        as `searched` {flag name: values} (a record's own layout fields are its candidate's)."""
        out = asdict(self)
        out["searched"] = {name: list(values) for name, values in self.searched}
        return out


@dataclass(frozen=True)
class ConfirmJob(RankJob, Ranks):
    """The cells of `--confirm` at one world size: `cells` is a JSON list of dicts (a plan's
    candidate and its micro-batch to run, planned figures beside), `plan` the PlanSpec's dict
    (JSON); `steps` timed steps after one warm-up for the cells that are timed, in each of
    `rounds` rounds: the timed cells run again after every cell of the round before, every
    other round in reverse order (A B C, C B A: a load that drifts over the run weighs on every
    cell alike); a later round's item is its cell's id + '@' + the round."""

    kind: ClassVar[str] = "plan"
    runner: ClassVar[str] = "lmperf.core.torchrun:run_job"
    worker: ClassVar[str] = "lmperf.questions.plan.confirm:run_cell"

    plan: str
    cells: str
    steps: int = 2
    seed: int = 0
    rounds: int = 1

    def __post_init__(self) -> None:
        self.check_ranks()
        positive_int("steps", self.steps)
        positive_int("rounds", self.rounds)

    def items(self) -> list[str]:
        """One item per cell (its id), the memory-only ones first (they warm the ranks: the
        heap, torch's lazy imports, the meshes' process groups; a first cell timed in a fresh
        process read up to 20% slow), then one per timed cell and later round."""
        cells = json.loads(self.cells)
        timed = [c["cell"] for c in cells if c["timed"]]
        return [c["cell"] for c in cells if not c["timed"]] + timed + [
            f"{name}@{r}" for r in range(1, self.rounds)
            for name in (timed[::-1] if r % 2 else timed)]

    def cell(self, item: str) -> dict:
        """The cell of item `item`, with its `round`."""
        name, _, r = item.partition("@")
        return {**next(c for c in json.loads(self.cells) if c["cell"] == name),
                "round": int(r or 0)}

    def item_spec(self, item: str) -> dict:
        """The record spec of one cell: the plan request and the candidate run."""
        cell = self.cell(item)
        return {**json.loads(self.plan), "confirm": True,
                **{k: cell.get(k) for k in ("cell", "precision", "checkpoint", "strategy",
                                            "dp_replicate", "dp_shard", "tp", "pp", "cp",
                                            "pp_schedule", "pp_virtual", "micro_batch",
                                            "grad_accum", "run_batch", "runner")},
                **({"round": cell["round"]} if cell["round"] else {})}

    def with_items(self, items: list[str]) -> "ConfirmJob":
        """Only the cells in `items`."""
        names = {item.partition("@")[0] for item in items}
        kept = [c for c in json.loads(self.cells) if c["cell"] in names]
        return type(self)(**{**self.to_full_dict(), "cells": json.dumps(kept)})

    def label(self) -> str:
        """Short name for progress lines."""
        return f"plan --confirm n={self.world_size} ({len(self.items())} cells)"


@dataclass(frozen=True)
class ConfirmAlone(ConfirmJob):
    """One cell of `--confirm` on one device (`--gpus 1`): no process group, forked from the
    warm server as any job, on this CPU or the GPU at hand."""

    runner: ClassVar[str] = "lmperf.questions.plan.confirm:run_alone"

    def label(self) -> str:
        """Short name for progress lines."""
        return f"plan --confirm {self.items()[0]}"
