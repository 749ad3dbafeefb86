"""Data-parallel wrappers, each a readable step from the last: naive -> flat -> overlap -> bucketed.

Every wrapper takes `(module)` (bucketed: `(module, bucket_size_mb)`), keeps it as `.module`,
broadcasts rank 0's parameters and buffers at construction (so every rank starts from the same
weights), runs the module's forward unchanged, and makes every gradient the MEAN over ranks in
`finish_gradient_synchronization()`, called after backward and before the optimizer step. With
equal per-rank batches and a mean loss, that mean is the gradient of the global batch: the
optimizer step then equals single-process training on the concatenated batch.

Parameters with `requires_grad=False` are never communicated (they have no gradient); tied
weights are one Parameter object, listed once by `module.parameters()`, so their gradient (the
sum over both uses, which autograd accumulates before the hook fires) is reduced once. gloo has
no average reduction, so gradients are divided by the world size before a SUM all-reduce.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from lmperf.units import MIB

def broadcast_from_rank0(module: nn.Module) -> None:
    """Overwrite every parameter and buffer with rank 0's (in place, no autograd)."""
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor, src=0)


class DataParallel(nn.Module):
    """The shared part: `.module`, the broadcast at construction, forward, trainable params."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        broadcast_from_rank0(module)

    def forward(self, *args: object, **kwargs: object) -> object:
        return self.module(*args, **kwargs)

    def trainable(self) -> list[nn.Parameter]:
        """Parameters that get gradients, each once (tied weights are one object)."""
        return [p for p in self.module.parameters() if p.requires_grad]

    def finish_gradient_synchronization(self) -> None:
        """Make every gradient the mean over ranks (blocking until it is)."""
        raise NotImplementedError

    def close(self) -> None:
        """Wait for anything in flight and drop hooks (before the wrapper is released)."""


class NaiveDDP(DataParallel):
    """After backward, one blocking all-reduce per parameter: simple, and as slow as it gets
    (one collective's latency per tensor, nothing overlapped with backward)."""

    def finish_gradient_synchronization(self) -> None:
        for p in self.trainable():
            if p.grad is not None:
                p.grad.div_(self.world_size)
                dist.all_reduce(p.grad)


class FlatDDP(DataParallel):
    """After backward, ONE all-reduce of all gradients flattened into a single buffer: one
    latency instead of one per tensor, at the cost of a copy in and out (2 x gradient bytes)."""

    def finish_gradient_synchronization(self) -> None:
        grads = [p.grad for p in self.trainable() if p.grad is not None]
        if not grads:
            return
        flat = _flatten_dense_tensors(grads)  # (sum of numels,)
        flat.div_(self.world_size)
        dist.all_reduce(flat)
        for g, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
            g.copy_(synced)


class OverlapDDP(DataParallel):
    """An asynchronous all-reduce per parameter, started by a post-accumulate-grad hook as soon
    as that gradient is final, so communication runs while backward computes the rest; the
    handles are waited for in `finish_gradient_synchronization` (the course's
    DDPIndividualParameters)."""

    def __init__(self, module: nn.Module):
        super().__init__(module)
        self._handles: list = []
        self._hooks = [p.register_post_accumulate_grad_hook(self._reduce) for p in self.trainable()]

    def _reduce(self, p: torch.Tensor) -> None:
        p.grad.div_(self.world_size)
        self._handles.append(dist.all_reduce(p.grad, async_op=True))

    def finish_gradient_synchronization(self) -> None:
        for handle in self._handles:
            handle.wait()
        self._handles.clear()

    def close(self) -> None:
        self.finish_gradient_synchronization()
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()


class _Bucket:
    """Parameters whose gradients travel together in one flat buffer."""

    def __init__(self, params: list[nn.Parameter]):
        self.params = params
        self.ready = 0
        self.flat: torch.Tensor | None = None
        self.handle = None


class BucketedDDP(DataParallel):
    """OverlapDDP with parameters grouped in buckets of at most `bucket_size_mb` MiB, filled in
    REVERSE parameter order (roughly the order backward produces gradients): a bucket's
    all-reduce starts when its last gradient is ready. Fewer, larger messages than one per
    parameter, still overlapped with backward (torch DDP's design, the course's DDPBucketed)."""

    def __init__(self, module: nn.Module, bucket_size_mb: float):
        super().__init__(module)
        self.bucket_size_mb = bucket_size_mb
        self.buckets = self._make_buckets(bucket_size_mb * MIB)
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self._hooks = [p.register_post_accumulate_grad_hook(self._ready) for p in self.trainable()]
        self._quiet = False

    @contextlib.contextmanager
    def no_sync(self):
        """Backward inside it only accumulates, as torch DDP's no_sync: the next sends the sums."""
        self._quiet = True
        try:
            yield
        finally:
            self._quiet = False

    def _make_buckets(self, capacity: float) -> list[_Bucket]:
        buckets, current, size = [], [], 0
        for p in reversed(self.trainable()):
            nbytes = p.numel() * p.element_size()
            if current and size + nbytes > capacity:  # a parameter larger than a bucket gets its own
                buckets.append(_Bucket(current))
                current, size = [], 0
            current.append(p)
            size += nbytes
        if current:
            buckets.append(_Bucket(current))
        return buckets

    def _ready(self, p: torch.Tensor) -> None:
        if self._quiet:
            return
        bucket = self._bucket_of[id(p)]
        bucket.ready += 1
        if bucket.ready == len(bucket.params):
            self._launch(bucket)

    def _launch(self, bucket: _Bucket) -> None:
        # A parameter unused in this forward has no gradient: it is reduced as zeros, so that
        # every rank's flat buffer has the same layout.
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket.params]
        bucket.flat = _flatten_dense_tensors(grads).div_(self.world_size)
        bucket.handle = dist.all_reduce(bucket.flat, async_op=True)

    def finish_gradient_synchronization(self) -> None:
        for bucket in self.buckets:
            if bucket.handle is None and bucket.ready:  # some gradient never arrived
                self._launch(bucket)
        for bucket in self.buckets:
            if bucket.handle is None:
                continue
            bucket.handle.wait()
            for p, synced in zip(bucket.params, _unflatten_dense_tensors(bucket.flat, bucket.params)):
                if p.grad is not None:  # unused everywhere: stays None, as without DDP
                    p.grad.copy_(synced)
            bucket.flat, bucket.handle, bucket.ready = None, None, 0

    def close(self) -> None:
        self.finish_gradient_synchronization()
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()


# The course's names for the same classes.
DDPIndividualParameters = OverlapDDP
DDPBucketed = BucketedDDP
