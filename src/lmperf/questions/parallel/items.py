"""What an item of `lmperf dist train` names: a data-parallel strategy, in a layout.

An item is one string (`Item.key`): 'fsdp2' (one data-parallel group over every rank: the
strategies of strategies.py), 'fsdp2 tp=2', 'fsdp2 dp_replicate=2', 'none pp=4
pp_schedule=1F1B micro_batch=1' ('none': the layout leaves a data-parallel degree of 1, so no
strategy). `check` refuses in one line what dist train cannot run, before anything launches.
Every piece of layout arithmetic is `estimate.layout.Layout`'s; how a layout is built is
layouts.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmperf.errors import SpecError
from lmperf.estimate.layout import Layout

NO_STRATEGY = "none"  # the strategy of a layout whose data-parallel degree is 1
WITH_LAYOUT = ("fsdp2",)  # the data-parallel strategies a TP / PP / HSDP layout composes with
DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")  # the mesh's dimensions, torchtitan's order
_KEYS = ("tp", "pp", "cp", "dp_replicate", "pp_schedule", "pp_virtual", "micro_batch")


@dataclass(frozen=True)
class Item:
    """One item of a train job: the data-parallel `strategy`, the `layout` it runs in (every
    degree 1 but the data-parallel shard: plain data parallelism) and, under a pipeline, its
    `micro_batch` (sequences per pipeline micro-batch)."""

    strategy: str
    layout: Layout
    micro_batch: int = 1

    @property
    def is_layout(self) -> bool:
        """Whether the layout is more than one data-parallel group over every rank."""
        return self.layout != Layout(self.layout.gpus)

    def key(self) -> str:
        """The item's string: the strategy, then the layout's degrees other than 1."""
        lay = self.layout
        if not self.is_layout:
            return self.strategy
        parts = [self.strategy] + [f"{n}={getattr(lay, n)}" for n in _KEYS[:4]
                                   if getattr(lay, n) > 1]
        if lay.pp > 1:
            parts.append(f"pp_schedule={lay.pp_schedule}")
            parts += [f"pp_virtual={lay.pp_virtual}"] if lay.pp_virtual > 1 else []
            parts.append(f"micro_batch={self.micro_batch}")
        return " ".join(parts)

    def spec_fields(self) -> dict:
        """What the item adds to a record's spec: nothing for plain data parallelism (its
        records keep their identity), else the layout's label and degrees."""
        if not self.is_layout:
            return {}
        return {"layout": self.layout.label(), **self.layout.fields(),
                "micro_batch": self.micro_batch if self.layout.pp > 1 else None}


def parse(item: str, world_size: int) -> Item:
    """The Item of string `item` at `world_size` ranks; SpecError for an unknown key."""
    strategy, *pairs = item.split()
    values: dict = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        if name not in _KEYS or not value:
            raise SpecError(f"cannot read layout {pair!r} of item {item!r}")
        values[name] = value if name == "pp_schedule" else int(value)
    micro = values.pop("micro_batch", 1)
    return Item(strategy, Layout(world_size, **values), micro)


def check(item: Item, *, num_layers: int, num_heads: int, context: int, batch: int,
          grad_accum: int, checkpoint: str | int, compute_dtype: str, device: str) -> None:
    """Refuse, in one line (SpecError), what `dist train` cannot run for this item: a strategy
    the layout does not compose with, context parallelism, what the layout cannot split
    (`Layout.check`), and under a pipeline accumulation, checkpointing or a compute dtype."""
    lay = item.layout
    if not item.is_layout:
        return
    where = f"{lay.label()} on {lay.gpus} ranks"
    if lay.cp > 1:
        raise SpecError("--cp: torch's context_parallel runs the CUDA attention kernels only "
                        "(SDPA's flash and efficient ones); a CPU cannot run it"
                        if device == "cpu" else
                        "--cp: context parallelism is not built into dist train yet (plan "
                        "prices it; torchtitan runs it)")
    if lay.dp == 1 and item.strategy != NO_STRATEGY:
        raise SpecError(f"{where} leaves a data-parallel degree of 1: no --strategy "
                        f"(got {item.strategy})")
    if lay.dp > 1 and item.strategy not in WITH_LAYOUT:
        raise SpecError(f"{where} leaves a data-parallel degree of {lay.dp}: its strategy is "
                        f"{' or '.join(WITH_LAYOUT)} (fully_shard on the data-parallel mesh, as "
                        f"torchtitan composes them; got {item.strategy})")
    lay.check(num_layers=num_layers, num_heads=num_heads, num_kv_heads=None, context=context,
              global_batch=lay.dp * batch * grad_accum,
              micro_batch=item.micro_batch if lay.pp > 1 else None)
    if compute_dtype != "fp32":
        raise SpecError(f"--compute-dtype {compute_dtype}: {where} runs fp32 parameters "
                        "(--precision bf16-mixed for bf16 compute)")
    if lay.pp > 1 and grad_accum > 1:
        raise SpecError(f"--grad-accum {grad_accum}: under --pp the step's micro-batches are "
                        "the pipeline's (--batch per replica, --micro-batch each)")
    if lay.pp > 1 and checkpoint != "none":
        raise SpecError("--checkpoint with --pp: a pipeline stage does not checkpoint its "
                        "blocks in dist train")


def check_schedule(item: Item, batch: int) -> None:
    """Refuse a pipeline schedule torch refuses for this many micro-batches (1F1B needs at
    least as many as stages, ...): torch builds it on placeholder stages and says why."""
    lay = item.layout
    if lay.pp == 1:
        return
    from lmperf.estimate.layout import schedule_refusal

    m = len(lay.micro_batches(lay.dp * batch, item.micro_batch))
    why = schedule_refusal(lay.pp_schedule, lay.pp, m, lay.pp_virtual)  # None: older torch too
    if why:
        raise SpecError(f"{lay.label()} with {m} micro-batches: torch refuses the schedule: "
                        f"{why}")
