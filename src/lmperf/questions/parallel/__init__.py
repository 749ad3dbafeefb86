"""`lmperf dist`: what data parallelism costs, and how much of the communication is hidden.

`lmperf.dist(...)` is `lmperf.questions.parallel.api.dist`. The strategies are
importable from here with the interfaces a course's harness uses (loaded on first access, so
that `import lmperf` stays cheap)::

    from lmperf.questions.parallel import OverlapDDP, BucketedDDP, FSDP2, ShardedOptimizer
    ddp = OverlapDDP(module)            # broadcasts rank 0's parameters
    loss.backward(); ddp.finish_gradient_synchronization(); optimizer.step()
"""

# public name -> "module:attribute", imported on first access
_EXPORTS: dict[str, str] = {
    "NaiveDDP": "lmperf.questions.parallel.ddp:NaiveDDP",
    "FlatDDP": "lmperf.questions.parallel.ddp:FlatDDP",
    "OverlapDDP": "lmperf.questions.parallel.ddp:OverlapDDP",
    "DDPIndividualParameters": "lmperf.questions.parallel.ddp:OverlapDDP",
    "BucketedDDP": "lmperf.questions.parallel.ddp:BucketedDDP",
    "DDPBucketed": "lmperf.questions.parallel.ddp:BucketedDDP",
    "ShardedOptimizer": "lmperf.questions.parallel.zero:ShardedOptimizer",
    "TorchDDP": "lmperf.questions.parallel.engines:TorchDDP",
    "FSDP2": "lmperf.questions.parallel.engines:FSDP2",
    "TorchZeRO1": "lmperf.questions.parallel.engines:TorchZeRO1",
    "STRATEGIES": "lmperf.questions.parallel.spec:STRATEGIES",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    if name in _EXPORTS:
        from lmperf.core.jobs import resolve

        return resolve(_EXPORTS[name])
    raise AttributeError(f"module 'lmperf.questions.parallel' has no attribute {name!r}")
