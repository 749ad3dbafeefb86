"""The attention sweep on the core: each AttnSpec a job of `lmperf.core.sweep.run_sweep`.

A configuration the registry cannot run here (a dtype it lacks, flash-triton without a GPU or
the interpreter) is an 'unsupported' row made in the parent, without starting a child.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from lmperf.questions.attention.spec import AttnSpec
from lmperf.core import sweep as core_sweep
from lmperf.core.launch import failed_record
from lmperf.core.sweep import SweepOptions


def unsupported_record(spec: AttnSpec) -> dict | None:
    """An 'unsupported' record made in the parent (no child started), or None if it can run."""
    import torch

    from lmperf import kernels
    from lmperf.questions.attention.job import TORCH_DTYPES, analytic_metrics

    reason = kernels.supports(spec.attention, torch.device(spec.device), TORCH_DTYPES[spec.dtype])
    if not reason:
        return None
    return failed_record(spec, "unsupported", reason, metrics={"analytic": analytic_metrics(spec)})


def run_sweep(specs: Sequence[AttnSpec], out: Path | None,
              options: SweepOptions | None = None) -> list[dict]:
    """Run `specs` (unsupported ones as rows without a child), appending each record to `out`
    (None: in memory only). Returns this sweep's records in order; raises ResultsFileError
    before running anything for an unwritable or corrupt `out`, SweepInterrupted on Ctrl-C."""
    return core_sweep.run_sweep(specs, out, options, precheck=unsupported_record)
