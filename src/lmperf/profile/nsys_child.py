"""The process Nsight Systems profiles: `python -m lmperf.profile.nsys_child SPEC.json`.

Warm-up steps first, then the measured steps inside one NVTX range (`MEASURED`) that nsys's
capture range starts and stops on, so the report holds the measured steps only. Every step
carries the same step / forward / loss / backward / optimizer ranges as the torch backend.
"""

from __future__ import annotations

import json
import sys

from lmperf.profile.nsys import MEASURED_RANGE as MEASURED  # one name for both sides


def main(argv: list[str] | None = None) -> int:
    """Run the spec in SPEC.json with NVTX ranges; exit 0 when the measured steps are done."""
    import torch

    from lmperf.workload.spec import RunSpec
    from lmperf.profile.annotate import WARMUP, annotate
    from lmperf.profile.capture import prepare_annotated
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
