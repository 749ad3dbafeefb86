"""The attention sweep: each AttnSpec in its own child process, each record appended as it ends.

Bench's machinery throughout: `ChildProcess` (timeout, kill of the process group, crash ->
'error' record with the log tail) with this kind's child module, `run_sweep` with this kind's
record kind and an 'unsupported' precheck made in the parent, `SweepOptions`, `SweepInterrupted`
and the append-only store with resume by spec key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from lmperf.attention.measure import KIND, TORCH_DTYPES, run_spec
from lmperf.attention.spec import AttnSpec
from lmperf import kernels
from lmperf.bench import sweep as bench_sweep
from lmperf.bench.launcher import ChildProcess, parent_env
from lmperf.bench.sweep import SweepInterrupted, SweepOptions
from lmperf.results.schema import make_record, to_jsonable

__all__ = ["AttentionChild", "SweepInterrupted", "SweepOptions", "pending_specs", "run_sweep"]


class AttentionChild(ChildProcess):
    """`ChildProcess` for an AttnSpec: runs `lmperf.attention.child`, records kind 'attention'."""

    child_module = "lmperf.attention.child"
    kind = KIND


def pending_specs(specs: Sequence[AttnSpec], out: Path, resume: bool) -> list[AttnSpec]:
    """The specs still to run: all, or (resume) those without an 'ok' attention row in `out`."""
    return bench_sweep.pending_specs(specs, out, resume, KIND)


def unsupported_record(spec: AttnSpec) -> dict | None:
    """An 'unsupported' record made in the parent (no child started), or None if it can run."""
    import torch

    reason = kernels.supports(spec.impl, torch.device(spec.device), TORCH_DTYPES[spec.dtype])
    if not reason:
        return None
    from lmperf.attention.measure import analytic_metrics

    return make_record(KIND, spec.to_dict(), "unsupported", parent_env(spec), message=reason,
                       metrics={"analytic": analytic_metrics(spec)})


def run_sweep(specs: Sequence[AttnSpec], out: Path, options: SweepOptions | None = None) -> list[dict]:
    """Run `specs` (unsupported ones as rows without a child) and append each record to `out`.

    Returns this sweep's records in order. Raises ResultsFileError before running anything if
    `out` cannot be written or (resume) holds a corrupt line, and SweepInterrupted on Ctrl-C.
    """
    return bench_sweep.run_sweep(specs, out, options, kind=KIND, child=AttentionChild,
                                 inline=lambda spec: to_jsonable(run_spec(spec)),
                                 precheck=unsupported_record)
