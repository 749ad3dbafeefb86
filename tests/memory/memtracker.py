"""The reference the simulator is checked against: torch's MemTracker on real CPU tensors running
lmperf's own step (after a warm-up step, as `lmperf memory` measures). Used by the tests and by
the docs' full comparison matrix (`python -m tests.memory.memtracker`)."""

from __future__ import annotations

import sys

import torch

from lmperf.runtime.precision import get_regime
from lmperf.workload.build import prepare
from lmperf.workload.spec import RunSpec
from lmperf.workload.steps import NO_OBSERVER


def memtracker_peak(spec: RunSpec) -> int:
    """Peak tracked bytes of one step of `spec` on real CPU tensors (MemTracker's 'Total')."""
    from torch.distributed._tools.mem_tracker import MemTracker

    prep = prepare(spec, torch.device("cpu"), get_regime(spec.precision))
    state = prep.state
    if spec.mode == "train-step":  # AdamW's state exists, as after lmperf memory's warm-up
        prep.step(state, NO_OBSERVER)
    tracker = MemTracker()
    tracker.track_external(state.model, state.optimizer, state.inputs, state.targets)
    with tracker:
        prep.step(state, NO_OBSERVER)
    snap = tracker.get_tracker_snapshot("peak")
    return int(next(iter(snap.values()))["Total"])


def main(argv: list[str]) -> None:
    """Print simulated vs MemTracker peaks (bytes, relative error) for a grid from the shell:
    sizes, contexts, precisions, optimizers, modes and (optionally) checkpointing policies as
    comma lists."""
    from lmperf.estimate.simulate import simulate_step

    sizes, contexts, precisions, optimizers, modes = (a.split(",") for a in argv[:5])
    policies = argv[5].split(",") if len(argv) > 5 else ["none"]
    print("size,context,precision,optimizer,mode,checkpoint,simulated,memtracker,error")
    for size in sizes:
        for t in map(int, contexts):
            for p in precisions:
                for o in optimizers:
                    for m in modes:
                        if m == "forward" and o != optimizers[0]:
                            continue  # forward has no optimizer
                        for c in policies if m != "forward" else ["none"]:
                            spec = RunSpec.from_size(size, context=t, batch=4, precision=p,
                                                     optimizer=o, mode=m, checkpoint=c)
                            sim = simulate_step(spec, spec.checkpoint).peak_bytes
                            ref = memtracker_peak(spec)
                            print(f"{size},{t},{p},{o},{m},{c},{sim},{ref},{sim / ref - 1:+.4f}",
                                  flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
