"""The layouts of `lmperf dist train` beyond one data-parallel group, built on the ranks:
tensor parallelism (with sequence and loss parallelism), pipeline parallelism, HSDP and their
products with FSDP2, from torch's own parts as torchtitan composes them
(torchtitan/models/llama3/parallelize.py): one `DeviceMesh` of the layout's degrees in
torchtitan's order (pp, dp_replicate, dp_shard, cp, tp), the pipeline split first
(`pipeline.py`), then TP on each stage (`tensor_parallel.py`), then `fully_shard` on the
data-parallel part of the mesh (1-D: FSDP; 2-D: HSDP). What an item names: items.py.
"""

from __future__ import annotations

import contextlib
from functools import partial

from lmperf.estimate.layout import Layout
from lmperf.questions.parallel.items import DIMS, Item

_MESHES: dict[tuple, tuple] = {}  # one mesh (and its flattened data-parallel mesh) per shape


def mesh_of(layout: Layout, device_type: str) -> tuple:
    """(the layout's DeviceMesh over every rank, its data-parallel dimensions flattened): one
    per shape and process (their process groups live as long as the process group)."""
    from torch.distributed.device_mesh import init_device_mesh

    sizes = (layout.pp, layout.dp_replicate, layout.dp_shard, layout.cp, layout.tp)
    key = (device_type, sizes)
    if key not in _MESHES:
        mesh = init_device_mesh(device_type, sizes, mesh_dim_names=DIMS)
        _MESHES[key] = (mesh, mesh["dp_replicate", "dp_shard"]._flatten("dp"))
    return _MESHES[key]


def build(item: Item, model, *, lr: float, batch: int, device):
    """A `strategies.Setup` running `model` (built identically on every rank) in `item`'s
    layout: pipeline stages, then TP, then fully_shard over the data-parallel mesh."""
    import torch
    import torch.nn as nn
    from torch.distributed.tensor.parallel import loss_parallel

    from lmperf.questions.parallel import pipeline, tensor_parallel
    from lmperf.questions.parallel.reference import loss_of
    from lmperf.questions.parallel.strategies import ADAMW, Setup

    lay = item.layout
    mesh, dp_flat = mesh_of(lay, device.type)
    parts = (pipeline.stages(model, lay, mesh.get_local_rank("pp")) if lay.pp > 1
             else [(0, model)])
    for _, module in parts:
        if lay.tp > 1:
            tensor_parallel.parallelize(module, mesh["tp"])
        if lay.dp > 1:
            dims = ("dp_replicate", "dp_shard") if lay.dp_replicate > 1 else ("dp_shard",)
            _shard(module, mesh[dims], reshard=lay.pp == 1)
    modules = [m for _, m in parts]
    root = modules[0] if lay.pp == 1 else nn.ModuleList(modules)
    optimizer = torch.optim.AdamW(root.parameters(), lr=lr, **ADAMW.get(device.type, {}))
    setup = Setup(root, optimizer, lambda: None, partial(_gather, modules, mesh, "param"),
                  contextlib.nullcontext, lambda: None,
                  context=loss_parallel if lay.tp > 1 else contextlib.nullcontext,
                  replica=(dp_flat.get_local_rank(), lay.dp),
                  full_grads=partial(_gather, modules, mesh, "grad"),
                  groups=_group_names(mesh))
    if lay.pp > 1:
        from torch.distributed.pipelining import PipelineStage

        group = mesh["pp"].get_group()
        stages = [PipelineStage(m, s, lay.stages, device, group=group) for s, m in parts]
        m = len(lay.micro_batches(lay.dp * batch, item.micro_batch))
        sched = pipeline.schedule(lay, stages, m, loss_of)
        setup.pipeline = partial(_step, sched, 0 in dict(parts))
        setup.record["pipeline"] = _schedule_record(lay, sched, m, item.micro_batch,
                                                    len(model.layers))
    return setup


def _group_names(mesh) -> dict[str, str]:
    """{process group name: mesh dimension} for the ledger: every group of this process whose
    ranks are a dimension's (an earlier item's mesh over the same ranks may own the group
    DTensor's collectives name: a 1 x 2 x 2 mesh's tp, then a 2 x 2 one's)."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _world

    dims = {tuple(sorted(dist.get_process_group_ranks(mesh[d].get_group()))): d for d in DIMS
            if mesh[d].size() > 1}
    return {pg.group_name: dims[ranks] for pg, members in _world.pg_group_ranks.items()
            if (ranks := tuple(sorted(members))) in dims}


def _shard(module, dp_mesh, reshard: bool) -> None:
    """fully_shard every block of `module`, then `module` (torch's FSDP2, on a 1-D mesh: FSDP,
    2-D: HSDP). Under a pipeline the gathered parameters stay for the step's micro-batches
    (reshard_after_forward=False, torchtitan's default with PP)."""
    from lmperf.questions.parallel.engines import fsdp2_api
    from lmperf.questions.parallel.tensor_parallel import blocks

    fully_shard, _ = fsdp2_api()  # type: ignore[misc]
    keep = {} if reshard else {"reshard_after_forward": False}
    for block in blocks(module):
        fully_shard(block, mesh=dp_mesh, **keep)
    fully_shard(module, mesh=dp_mesh, **keep)


def _step(schedule, first: bool, inputs, targets):
    """One pipeline step: the rank's batch through the schedule (inputs on the first stage's
    rank); the mean of the micro-batches' losses on the last stage's rank, else None. The last
    stage's outputs are not kept for a return value (`return_outputs=False`, as torchtitan's
    trainer steps): torch's default keeps every micro-batch's logits to the next step."""
    import inspect

    import torch

    losses: list = []
    quiet = ({"return_outputs": False}
             if "return_outputs" in inspect.signature(schedule.step).parameters else {})
    schedule.step(*((inputs,) if first else ()), target=targets, losses=losses, **quiet)
    return torch.stack([loss.detach() for loss in losses]).mean() if losses else None


def _gather(modules: list, mesh, what: str) -> dict:
    """{name: full parameter or gradient} of every stage, on rank 0 ({} on the others): each
    DTensor made whole within its mesh (a collective), then the first rank of each stage's
    data-parallel x TP group sends its stage's."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    lead = all(mesh.get_local_rank(d) == 0 for d in DIMS[1:])
    mine = {}
    for module in modules:
        for name, p in module.named_parameters():
            t = p if what == "param" else p.grad
            if t is None:
                continue
            full = t.full_tensor() if isinstance(t, DTensor) else t
            if lead:
                mine[name] = full.detach().clone()
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine, out, dst=0)
    return {k: v for part in out for k, v in part.items()} if out else {}


def _schedule_record(lay: Layout, sched, micro_batches: int, micro_batch: int,
                     num_layers: int) -> dict:
    """The pipeline's record fields: its shape and each rank's idle slots (pipeline.idle_slots
    over torch's action lists) beside the layout's formula in the same unit."""
    from lmperf.questions.parallel.pipeline import idle_slots

    order = getattr(sched, "pipeline_order", None)
    counted = idle_slots(order, lay.stages) if order else None
    v = lay.pp_virtual  # a rank's forward of one micro-batch is v slots (one per stage)
    return {"schedule": lay.pp_schedule, "stages": lay.stages, "stages_per_rank": v,
            "micro_batches": micro_batches, "micro_batch": micro_batch,
            "blocks_per_stage": [s.layers for s in lay.split(num_layers)],
            "slot": "one action: a stage's forward or backward of one micro-batch",
            "slots": counted and counted["slots"], "busy_slots": counted and counted["busy"],
            "idle_slots": counted and counted["idle"],
            "formula_idle_slots": lay.bubble(micro_batches, v, v),
            "source": ("torch's pipeline_order, replayed one slot per action" if counted
                       else "this torch's schedule exposes no action list")}
