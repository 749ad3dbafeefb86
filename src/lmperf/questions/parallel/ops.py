"""The flat-tensor collectives lmperf issues, feature-detected across torch versions.

torch 2.13 renamed the flat-tensor collectives (`all_gather_into_tensor` ->
`all_gather_single`, `reduce_scatter_tensor` -> `reduce_scatter_single`) and warns on the old
names; both are looked up once here.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16,
                                  "fp16": torch.float16}


def _first(*names: str):
    for name in names:
        fn = getattr(dist, name, None)
        if fn is not None:
            return fn
    raise RuntimeError(f"this torch has none of torch.distributed.{'/'.join(names)}")


_ALL_GATHER = _first("all_gather_single", "all_gather_into_tensor")
_REDUCE_SCATTER = _first("reduce_scatter_single", "reduce_scatter_tensor")


def all_gather_flat(out: torch.Tensor, shard: torch.Tensor, async_op: bool = False):
    """out (n * k,) <- the concatenation of every rank's shard (k,), in rank order."""
    return _ALL_GATHER(out, shard, async_op=async_op)


def reduce_scatter_flat(out: torch.Tensor, full: torch.Tensor, async_op: bool = False):
    """out (k,) <- this rank's k-slice of the sum over ranks of full (n * k,)."""
    return _REDUCE_SCATTER(out, full, async_op=async_op)
