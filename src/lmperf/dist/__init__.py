"""`lmperf dist`: what data parallelism costs, and how much of the communication is hidden.

`lmperf.dist(...)` (this package, callable) is `lmperf.dist.api.dist`. The strategies are
importable from here with the interfaces a course's harness uses (loaded on first access, so
that `import lmperf` stays cheap)::

    from lmperf.dist import OverlapDDP, BucketedDDP, FSDP, ShardedOptimizer
    ddp = OverlapDDP(module)            # broadcasts rank 0's parameters
    loss.backward(); ddp.finish_gradient_synchronization(); optimizer.step()
"""

from lmperf._callable import make_callable

# public name -> "module:attribute", imported on first access
_EXPORTS: dict[str, str] = {
    "NaiveDDP": "lmperf.dist.ddp:NaiveDDP",
    "FlatDDP": "lmperf.dist.ddp:FlatDDP",
    "OverlapDDP": "lmperf.dist.ddp:OverlapDDP",
    "DDPIndividualParameters": "lmperf.dist.ddp:OverlapDDP",
    "BucketedDDP": "lmperf.dist.ddp:BucketedDDP",
    "DDPBucketed": "lmperf.dist.ddp:BucketedDDP",
    "FSDP": "lmperf.dist.fsdp:FSDP",
    "ShardedOptimizer": "lmperf.dist.zero:ShardedOptimizer",
    "TorchDDP": "lmperf.dist.engines:TorchDDP",
    "FSDP2": "lmperf.dist.engines:FSDP2",
    "TorchZeRO1": "lmperf.dist.engines:TorchZeRO1",
    "STRATEGIES": "lmperf.dist.strategies:STRATEGIES",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    if name in _EXPORTS:
        from lmperf.core.jobs import resolve

        return resolve(_EXPORTS[name])
    raise AttributeError(f"module 'lmperf.dist' has no attribute {name!r}")


make_callable(__name__, "lmperf.dist.api:dist")
