"""The in-process runner of a ProfileSpec: capture and analyse with its backend, return a record.

It runs where the launcher puts it (a child process by default). Any failure of the run itself
is a record: out of memory an 'oom' row, anything else an 'error' row (core.outcome.failure);
a precision this device cannot run is 'unsupported'.
"""

from __future__ import annotations

from pathlib import Path

import torch

from lmperf.core.outcome import Stage, failure
from lmperf.questions.profile.plan import default_trace
from lmperf.questions.profile.record import KIND, to_record
from lmperf.questions.profile.spec import ProfileSpec
from lmperf.results.schema import make_record
from lmperf.runtime import device as dev
from lmperf.runtime import env as envmod
from lmperf.runtime.precision import get_regime, unsupported_reason


def run_profile(spec: ProfileSpec) -> dict:
    """Profile `spec` in this process and return its record (ok, oom, error or unsupported).

    Never raises for a failure of the run: the record says what failed and while doing what.
    """
    device = torch.device(spec.device)
    environment = envmod.capture(device)
    run = spec.workload()

    def record(status: str, **fields: object) -> dict:
        return make_record(KIND, spec.record_spec(), status, environment, **fields)

    if (why := unsupported_reason(get_regime(spec.precision), device)):
        return record("unsupported", message=why)
    environment["torch_threads"] = torch.get_num_threads()
    stage = Stage("starting")
    trace = Path(spec.trace) if spec.trace else default_trace(run)
    try:
        if spec.backend == "nsys":
            from lmperf.questions.profile.backends.nsys import profile_nsys

            # nsys runs the steps in a process of its own; the stage is that whole run
            stage.now = "profiling under Nsight Systems"
            result = profile_nsys(run, trace.with_suffix(""), top=spec.top)
        else:
            from lmperf.questions.profile.backends.torch_profiler import profile_torch

            result = profile_torch(run, trace, top=spec.top, stage=stage)
        environment.update(dev.tf32_state())  # what was in force during the run
        return to_record(result, environment)
    except Exception as exc:  # the run failed: a row, not a crash
        return record(**failure(exc, stage))
    finally:
        dev.free_memory(device)
