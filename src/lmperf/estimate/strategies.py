"""THE per-strategy table: what each way of spreading a training step over ranks keeps of each
memory category, which collectives it issues and what they hide behind. Memory
(`estimate.fit.rank_peak`), time and communication (`estimate.plan.step_time`) and
`dist --estimate`'s rows all read it; the table as prose: docs/commands/plan.md."""

from __future__ import annotations

from dataclasses import dataclass

STATES: tuple[str, ...] = ("parameters", "gradients", "optimizer state")
BUCKET_BYTES = 25 * 2**20  # DDP's default bucket: the last one is exposed


@dataclass(frozen=True)
class Collective:
    """One collective a strategy issues: `op` (all_reduce, all_gather, reduce_scatter,
    broadcast) of `payload` ('grads': fp32 gradients; 'weights': parameters in the dtype the
    strategy gathers them; 'params': fp32 parameters; 'activations': one micro-batch's (b T, C)),
    `every` 'step' (after the last micro-batch) or 'micro' (each), hidden behind `hides`
    ('forward' / 'backward' of its micro-batch, 'never'), sent as `split` messages ('one';
    'tensors': one per parameter tensor; 'units': one per gathered unit; 'layers': the 4 L + 2
    all-reduces of tensor parallelism)."""

    op: str
    payload: str
    every: str
    hides: str
    split: str


@dataclass(frozen=True)
class Strategy:
    """A strategy: the state categories a data-parallel rank keeps 1/d of (`shards`), its
    collectives in issue order, whether it holds gathered units (`gathers`: FSDP) and torch
    DDP's gradient buckets for the whole step (`buckets`)."""

    shards: tuple[str, ...]
    collectives: tuple[Collective, ...]
    gathers: bool = False
    buckets: bool = False


_REDUCE = Collective("all_reduce", "grads", "step", "backward", "one")
STRATEGIES: dict[str, Strategy] = {
    "single": Strategy((), ()),
    "ddp": Strategy((), (_REDUCE,), buckets=True),
    # torch's ZeroRedundancyOptimizer (and lmperf's readable one): DDP's all-reduce, then each
    # updated parameter tensor broadcast from its owner
    "zero1": Strategy(("optimizer state",), (
        _REDUCE, Collective("broadcast", "params", "step", "never", "tensors")), buckets=True),
    "zero2": Strategy(("optimizer state", "gradients"), (
        Collective("reduce_scatter", "grads", "micro", "backward", "one"),
        Collective("all_gather", "params", "step", "never", "one"))),
    # FSDP2 gathers a block at a time (and the root) in forward and again in backward
    "fsdp": Strategy(STATES, (
        Collective("all_gather", "weights", "micro", "forward", "units"),
        Collective("all_gather", "weights", "micro", "backward", "units"),
        Collective("reduce_scatter", "grads", "micro", "backward", "units")), gathers=True),
}
# Megatron's tensor parallelism (no sequence parallelism): 4 L + 2 all-reduces of a micro-batch's
# activations, in the critical path
TP_ALL_REDUCES = Collective("all_reduce", "activations", "micro", "never", "layers")
DATA_PARALLEL: tuple[str, ...] = ("ddp", "zero1", "zero2", "fsdp")


def strategy(name: str) -> Strategy:
    """The table's entry for `name`; 'fsdp+tp' is fsdp's (tensor parallelism adds its
    all-reduces), 'tp' single's. KeyError for an unknown name."""
    return STRATEGIES[{"fsdp+tp": "fsdp", "tp": "single"}.get(name, name)]


def collectives(name: str, t: int) -> tuple[Collective, ...]:
    """What `name` issues with tensor-parallel degree `t`: its data-parallel collectives, and
    TP's all-reduces when t > 1."""
    return strategy(name).collectives + ((TP_ALL_REDUCES,) if t > 1 else ())
