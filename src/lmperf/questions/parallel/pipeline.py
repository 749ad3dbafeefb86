"""Pipeline parallelism from `torch.distributed.pipelining`, as torchtitan builds it
(torchtitan/distributed/pipeline_parallel.py): the model cut into stages at the layout's split
(`Layout.split`, torchtitan's), one `PipelineStage` per stage a rank runs (`Layout.rank_stages`),
and torch's schedule by name (GPipe, 1F1B, Interleaved1F1B, ...).

On a CPU whose ranks share a few cores, the time a pipeline rank idles says little; the
schedule's shape does not change: `idle_slots` replays torch's own action lists
(`schedule.pipeline_order`, every rank's) with one time slot per action and counts, per rank,
the slots it waits for a neighbour's forward or backward.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable

import torch
import torch.nn as nn

from lmperf.estimate.layout import Layout


class Stage(nn.Module):
    """Blocks [first, first + layers) of `model`, with its embedding on the first stage and its
    final norm and lm_head on the last: ids (b, T) or activations (b, T, C) -> activations or
    logits (b, T, V). The modules are the model's own, under the model's names (`layers` is a
    ModuleDict keyed by the block's index, as torchtitan keeps it), so a parameter's name is
    the same here as in the whole model."""

    def __init__(self, model: nn.Module, first: int, layers: int, embedding: bool, head: bool):
        super().__init__()
        self.token_embeddings = model.token_embeddings if embedding else None
        self.layers = nn.ModuleDict({str(i): model.layers[i] for i in range(first, first + layers)})
        self.ln_final = model.ln_final if head else None
        self.lm_head = model.lm_head if head else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.token_embeddings is not None:
            x = self.token_embeddings(x)  # (b, T) -> (b, T, C)
        for block in self.layers.values():
            x = block(x)
        if self.lm_head is not None:
            x = self.lm_head(self.ln_final(x))  # (b, T, V)
        return x


def stages(model: nn.Module, layout: Layout, pp_rank: int) -> list[tuple[int, Stage]]:
    """(stage index, module) of every stage pipeline rank `pp_rank` runs."""
    split = layout.split(len(model.layers))
    return [(s, Stage(model, split[s].first, split[s].layers, split[s].embedding, split[s].head))
            for s in layout.rank_stages(pp_rank)]


def schedule(layout: Layout, pipeline_stages: list, micro_batches: int,
             loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
    """torch's schedule of `layout.pp_schedule` over this rank's PipelineStages, `micro_batches`
    per step; each micro-batch's loss is a mean, and torch divides the gradients by the
    micro-batches (scale_grads), so a step's gradients are the mean over the rank's batch."""
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

    cls = get_schedule_class(layout.pp_schedule)
    single = issubclass(cls, PipelineScheduleSingle)
    return cls(pipeline_stages[0] if single else pipeline_stages, n_microbatches=micro_batches,
               loss_fn=loss_fn)


_COMPUTE = {"F": "F", "B": "B", "I": "B", "W": "W"}  # torch's action types; I: input gradient


def idle_slots(order: dict[int, list], num_stages: int) -> dict:
    """Replay `order` (rank -> torch's actions, None for a deliberate idle step) one slot per
    compute action: a stage's forward of micro-batch m waits for the previous stage's, its
    backward (full, or input part) for the next stage's; a weight-gradient part waits for
    nothing. Each stage's forwards (and backwards) are numbered in the order the rank runs them
    (torch's own list for 1F1B's last rank numbers them 1..m; it runs 0..m-1). Returns
    {'slots': the step's length in slots, 'busy': [per rank], 'idle': [per rank]}."""
    queues: dict[int, list[tuple[int, str, int]]] = {}
    for rank, actions in sorted(order.items()):
        count: dict[tuple[int, str], int] = defaultdict(int)
        queue = []
        for action in actions:
            kind = _COMPUTE.get(getattr(getattr(action, "computation_type", None), "value", ""))
            if kind is None:
                continue  # an idle step, a send / recv, a gradient reduction, ...
            key = (action.stage_index, kind)
            queue.append((action.stage_index, kind, count[key]))
            count[key] += 1
        queues[rank] = queue
    done: set[tuple[int, str, int]] = set()
    at = {rank: 0 for rank in queues}
    slots = 0
    while any(at[r] < len(q) for r, q in queues.items()):
        ran = []
        for rank, queue in queues.items():
            if at[rank] == len(queue):
                continue
            stage, kind, m = queue[at[rank]]
            ready = (kind == "W" or kind == "F" and (stage == 0 or (stage - 1, "F", m) in done)
                     or kind == "B" and (stage == num_stages - 1 or (stage + 1, "B", m) in done))
            if ready:
                ran.append((stage, kind, m))
                at[rank] += 1
        if not ran:
            raise ValueError("the schedule's actions wait on each other (no action can run)")
        done.update(ran)
        slots += 1
    busy = [len(queues[r]) for r in sorted(queues)]
    return {"slots": slots, "busy": busy, "idle": [slots - b for b in busy]}
