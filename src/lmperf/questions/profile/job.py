"""The in-process runner of a ProfileSpec: capture and analyse with its backend, return a record.

It runs where the launcher puts it (a child process by default). Any failure of the run itself
is a record: out of memory an 'oom' row, anything else an 'error' row (core.outcome.failure);
a precision this device cannot run is 'unsupported'.
"""

from __future__ import annotations

from pathlib import Path

from lmperf.core.envelope import Run, measured
from lmperf.questions.profile.plan import default_trace
from lmperf.questions.profile.report import KIND, record_fields
from lmperf.questions.profile.spec import ProfileSpec


def run_profile(spec: ProfileSpec) -> dict:
    """Profile `spec` in this process and return its record (ok, oom, error or unsupported).

    Never raises for a failure of the run (`core.envelope.measured`): the record says what
    failed and while doing what.
    """
    return measured(KIND, spec, _profile, precision=spec.precision,
                    record_spec=spec.record_spec())


def _profile(spec: ProfileSpec, run: Run) -> dict:
    workload = spec.workload()
    trace = Path(spec.trace) if spec.trace else default_trace(workload)
    from lmperf.questions.profile.backends.torch_profiler import profile_torch

    return record_fields(profile_torch(workload, trace, top=spec.top, stage=run.stage))
