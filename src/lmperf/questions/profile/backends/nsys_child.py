"""The process Nsight Systems profiles: `python -m lmperf.questions.profile.backends.nsys_child SPEC.json`.

Warm-up steps first, then the measured steps inside one NVTX range (`MEASURED`) that nsys's
capture range starts and stops on, so the report holds the measured steps only. Every step
carries the same step / forward / loss / backward / optimizer ranges as the torch backend.

`nsys stats --filter-nvtx` keeps the kernels inside a range's CPU start and end (see `nsys`),
and the benchmark's step closes each phase with a synchronisation only after its range has
closed: a GPU-bound phase's kernels would still be running when the CPU pops the range, and
fall out of it. Here every phase range drains the device when it opens (the kernels of an
enclosing range, e.g. forward's before loss, stay out of it) and before it closes (its own
kernels are all in it), so the filter's time window holds exactly the phase's kernels. The
sync points are those the benchmark has anyway (a sync per phase boundary), moved inside the
ranges; the attention sub-ranges are not synchronised (nsys tables do not filter on them).
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Callable, ContextManager, Iterator

from lmperf.questions.profile.annotate import BACKWARD, FORWARD, LOSS, OPTIMIZER, STEP
from lmperf.questions.profile.backends.nsys_commands import MEASURED_RANGE as MEASURED  # one name for both sides

SYNCED_RANGES: tuple[str, ...] = (STEP, FORWARD, LOSS, BACKWARD, OPTIMIZER)


def synced_annotate(device, annotate: Callable[[str], ContextManager] | None = None,
                    sync: Callable[[object], None] | None = None,
                    names: tuple[str, ...] = SYNCED_RANGES) -> Callable[[str], ContextManager]:
    """A `state.annotate` that opens the range `annotate(name)` and, for the ranges in `names`,
    synchronises `device` right after it opens and right before it closes.

    annotate: range name -> context (default: `profile.annotate.annotate`, record_function +
    NVTX); sync: device -> None (default: `runtime.device.synchronize`), both looked up when a
    range opens.
    """

    @contextlib.contextmanager
    def ranged(name: str) -> Iterator[None]:
        from lmperf.questions.profile import annotate as annotate_module
        from lmperf.runtime import device as dev

        open_range = annotate or annotate_module.annotate
        if name not in names:
            with open_range(name):
                yield
            return
        drain = sync or dev.synchronize
        with open_range(name):
            drain(device)  # what enclosing ranges queued before this one is not this one's
            yield
            drain(device)  # every kernel of this range ends before the range does

    return ranged


def main(argv: list[str] | None = None) -> int:
    """Run the spec in SPEC.json with NVTX ranges; exit 0 when the measured steps are done."""
    import torch

    from lmperf.workload.spec import RunSpec
    from lmperf.questions.profile.annotate import WARMUP, annotate
    from lmperf.questions.profile.backends.torch_capture import prepare_annotated
    from lmperf.runtime import device as dev
    from lmperf.runtime.precision import get_regime, matmul_precision

    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0], encoding="utf-8") as f:
        spec = RunSpec.from_dict(json.load(f))
    if spec.threads:  # the same thread policy as every other job (0: torch's default)
        torch.set_num_threads(spec.threads)
    device = torch.device(spec.device)
    regime = get_regime(spec.precision)
    with matmul_precision(regime):
        prepared, _ = prepare_annotated(spec, device, regime)
        state, step = prepared.state, prepared.step
        state.annotate = synced_annotate(device, annotate=state.annotate)
        clock = dev.PhaseClock(device)  # closes each phase with a sync, as the benchmark does
        with annotate(WARMUP):
            for _ in range(spec.warmup):
                step(state, clock)
        dev.synchronize(device)
        with annotate(MEASURED):
            for _ in range(spec.steps):
                step(state, clock)
            dev.synchronize(device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
