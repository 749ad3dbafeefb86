"""One configuration a plan prices: a layout (`estimate.layout`), the data-parallel strategy over
its replicas, the precision, activation checkpointing and the micro-batch; its record fields."""

from __future__ import annotations

from dataclasses import dataclass

from lmperf.errors import SpecError
from lmperf.estimate.layout import Layout
from lmperf.estimate.strategies import STRATEGIES  # hsdp: fsdp with layout.dp_replicate > 1
from lmperf.names import FLOAT8_RECIPES as FLOAT8  # torchao's recipes, and none


@dataclass(frozen=True)
class Candidate:
    """A configuration: `layout`, `strategy` over its data-parallel degree ('single' when it is
    1), `precision` (a plan precision: fp32, bf16-mixed, bf16-fsdp), `checkpoint` (a policy:
    none, full, op, every-K, groups of G; any spelling `validate.checkpoint_policy` reads), `micro_batch` sequences per forward on a rank and `grad_accum` micro-batches
    per step outside a pipeline, `compile` (torch.compile of the model), `float8` (torchao's
    recipe for the blocks' Linear layers, or 'none'). SpecError when the strategy does not fit the layout: DDP
    replicates (no shard degree), ZeRO shards over every replica, FSDP needs a shard group
    (dp_shard x cp > 1: torchtitan shards over both)."""

    precision: str
    checkpoint: str | int
    strategy: str
    layout: Layout
    micro_batch: int
    grad_accum: int
    compile: bool = False
    float8: str = "none"

    def __post_init__(self) -> None:
        from lmperf.validate import checkpoint_policy, choice

        object.__setattr__(self, "checkpoint", checkpoint_policy(self.checkpoint))
        lay, s = self.layout, self.strategy
        choice("strategy", s, STRATEGIES)
        ok = {"single": lay.dp == 1,
              "ddp": lay.dp_shard == 1 and lay.dp_replicate > 1,
              "zero1": lay.dp_replicate == 1 and lay.dp_shard > 1,
              "zero2": lay.dp_replicate == 1 and lay.dp_shard > 1,
              "fsdp": lay.dp_shard * lay.cp > 1}[s]
        if not ok:
            raise SpecError(f"{s} does not fit the layout {lay.label()}")
        if self.precision == "bf16-fsdp" and s != "fsdp":
            raise SpecError("bf16-fsdp is FSDP's mixed-precision policy: it needs fsdp")
        choice("float8 recipe", self.float8, FLOAT8)
        if self.float8 != "none" and self.precision == "fp32":
            raise SpecError("float8 trains the Linear layers in float8 beside a bf16 step: "
                            "not with fp32")

    @property
    def shard_degree(self) -> int:
        """Ranks that share one copy of the sharded states: FSDP's dp_shard x cp, ZeRO's every
        replica, 1 for DDP and one device."""
        lay = self.layout
        return {"fsdp": lay.dp_shard * lay.cp, "zero1": lay.dp, "zero2": lay.dp}.get(
            self.strategy, 1)

    def fields(self) -> dict:
        """The record fields: precision, checkpoint, strategy, the layout's, micro_batch and
        grad_accum."""
        return {"precision": self.precision, "checkpoint": self.checkpoint,
                "strategy": self.strategy, **self.layout.fields(),
                "micro_batch": self.micro_batch, "grad_accum": self.grad_accum,
                "compile": self.compile, "float8": self.float8}
