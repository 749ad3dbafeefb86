"""THE per-strategy table: what each way of spreading a training step over ranks keeps of each
memory category, which collectives it issues, over which group, and what they hide behind.
Memory (`estimate.fit.rank_peak`), time and communication (`estimate.step_time`) and
`dist --estimate`'s rows all read it; the table as prose: docs/commands/plan.md."""

from __future__ import annotations

from dataclasses import dataclass, replace

from lmperf.units import MIB

STATES: tuple[str, ...] = ("parameters", "gradients", "optimizer state")
BUCKET_BYTES = 25 * MIB  # DDP's default bucket: the last one is exposed


@dataclass(frozen=True)
class Collective:
    """One collective: `op` (all_reduce, all_gather, reduce_scatter, broadcast) of `payload`
    ('grads': fp32 gradients; 'weights': parameters in the dtype they are gathered in;
    'params': fp32 parameters; 'activations': one micro-batch's (b, T / cp, C) in the compute
    dtype; 'kv': one layer's K and V over the whole sequence, (b, T, 2 Hkv D / t)), over `group`
    ('shard': the ranks sharing one copy of the sharded states; 'replicate': the replicas;
    'tp'; 'cp'), `every` 'step' (once per step) or 'micro' (each micro-batch), hidden behind
    `hides` ('forward' / 'backward' of its micro-batch, 'never'), sent as `split` messages
    ('one'; 'tensors': one per parameter tensor; 'units': one per gathered unit, the blocks and
    the root; 'blocks': under TP two per block and one more for the output (attention and the
    MLP), under FSDP one per block; 'attention': one per block; 'loss': loss parallelism's 3),
    `per` passes of that many ('forward', 'backward', 'recompute': the forward again under
    checkpointing). Payloads beyond those above: 'block weights' (the blocks' part of
    'weights'), 'norm grads' (the replicated norms' fp32 gradients), 'loss' (3 (b, T / cp)
    fp32 tensors)."""

    op: str
    payload: str
    every: str
    hides: str
    split: str
    group: str = "shard"
    per: str = "step"


@dataclass(frozen=True)
class Strategy:
    """A data-parallel strategy: the state categories a rank keeps 1 / (its shard degree) of
    (`shards`), its collectives in issue order, whether it holds gathered units (`gathers`:
    FSDP) and torch DDP's gradient buckets for the whole step (`buckets`)."""

    shards: tuple[str, ...]
    collectives: tuple[Collective, ...]
    gathers: bool = False
    buckets: bool = False


_REDUCE = Collective("all_reduce", "grads", "step", "backward", "one", "replicate")
STRATEGIES: dict[str, Strategy] = {
    "single": Strategy((), ()),
    "ddp": Strategy((), (_REDUCE,), buckets=True),
    # torch's ZeroRedundancyOptimizer: DDP's all-reduce, then each updated parameter tensor
    # broadcast from its owner
    "zero1": Strategy(("optimizer state",), (
        replace(_REDUCE, group="shard"),
        Collective("broadcast", "params", "step", "never", "tensors")), buckets=True),
    "zero2": Strategy(("optimizer state", "gradients"), (
        Collective("reduce_scatter", "grads", "micro", "backward", "one"),
        Collective("all_gather", "params", "step", "never", "one"))),
    # FSDP2 gathers a block at a time (and the root: embedding, final norm, head) in forward,
    # the blocks again in backward (the root is not resharded after forward: torchtitan's)
    "fsdp": Strategy(STATES, (
        Collective("all_gather", "weights", "micro", "forward", "units"),
        Collective("all_gather", "block weights", "micro", "backward", "blocks"),
        Collective("reduce_scatter", "grads", "micro", "backward", "units")), gathers=True),
}
DATA_PARALLEL: tuple[str, ...] = ("ddp", "zero1", "zero2", "fsdp")
# Tensor parallelism with sequence parallelism (torchtitan's, Megatron's): around attention and
# the MLP of every block an all-gather of the (b, T / cp, C) activations before the
# column-parallel matmuls and a reduce-scatter after the row-parallel one (and one more of each
# for the embedding and the output), each the other's gradient in backward, again in recompute
TENSOR_PARALLEL = tuple(Collective(op, "activations", "micro", "never", "blocks", "tp", per)
                        for per in ("forward", "backward", "recompute")
                        for op in ("all_gather", "reduce_scatter")) + (
    # the norms' weights (replicated) sum their gradients over the group once a step; loss
    # parallelism's log-softmax sums 3 (b, T) tensors (max, sum of exponents, target logits)
    Collective("all_reduce", "norm grads", "step", "never", "one", "tp"),
    Collective("all_reduce", "loss", "micro", "never", "loss", "tp"))
# Context parallelism as torch's context_parallel runs SDPA (torchtitan's default rotation,
# all-gather): each attention all-gathers the sequence's K and V, backward again (and in
# recompute), and reduce-scatters their gradients
CONTEXT_PARALLEL = tuple(Collective(op, "kv", "micro", "never", "attention", "cp", per)
                         for op, per in (("all_gather", "forward"), ("all_gather", "backward"),
                                         ("reduce_scatter", "backward"),
                                         ("all_gather", "recompute")))


def strategy(name: str) -> Strategy:
    """The table's entry for `name` (KeyError for an unknown name)."""
    return STRATEGIES[name]


def collectives(name: str, tp: int = 1, cp: int = 1, pp: int = 1,
                replicate: int = 1) -> tuple[Collective, ...]:
    """What `name` issues in a layout of those degrees: its data-parallel collectives (under a
    pipeline FSDP2 gathers once per step and reduce-scatters after the last micro-batch, as
    torchtitan runs it: no resharding between micro-batches; HSDP all-reduces the shards'
    gradients across `replicate` replicas), and TP's and CP's when their degree is > 1."""
    out = list(strategy(name).collectives)
    if name == "fsdp" and pp > 1:
        out = [replace(x, every="step") for x in out if x.hides != "backward" or
               x.op != "all_gather"]
    if name == "fsdp" and replicate > 1:
        out.append(Collective("all_reduce", "grads", out[-1].every, "backward", "units",
                              "replicate"))
    return (tuple(out) + (TENSOR_PARALLEL if tp > 1 else ())
            + (CONTEXT_PARALLEL if cp > 1 else ()))
