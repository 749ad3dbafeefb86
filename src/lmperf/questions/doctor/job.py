"""The doctor's job body (`CheckJob.runner`): run a job's checks, one `kind: "doctor"` record
each.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

# The check table (every check's module) at import: the warm server imports a job's runner
# module once before forking, so each check's child does not import them again (0.6 s a job).
from lmperf.questions.doctor import registry
from lmperf.questions.doctor.checks import Context, run_one
from lmperf.questions.doctor.records import check_record
from lmperf.questions.doctor.spec import CheckJob
from lmperf.runtime import device as dev
from lmperf.runtime import env as envmod


def run_job(job: CheckJob) -> list[dict]:
    """Run the job's checks in order on its device, in a scratch folder; one record per check
    (ok / error for a failed check / unsupported for a skipped one; see
    `records.check_record`). The checks seed torch; the caller's random streams are restored
    (an inline run)."""
    by_name = {c.name: c for c in registry.CHECKS}
    device = torch.device(job.device)
    environment = envmod.capture(device)
    rng_devices = [dev.cuda_index(device)] if device.type == "cuda" else []
    records = []
    with tempfile.TemporaryDirectory(prefix="lmperf-doctor-") as tmp, \
            torch.random.fork_rng(devices=rng_devices):
        ctx = Context(device, Path(tmp))
        for name in job.checks:
            begin = time.perf_counter()
            outcome = run_one(by_name[name], ctx)
            row = outcome.row(name, job.scope, time.perf_counter() - begin)
            records.append(check_record(row, job.item_spec(name), environment))
    return records
