"""`lmperf.doctor(...)`: check, briefly and for real, each path lmperf relies on here; a Report.

Each check is a job (`doctor.spec.CheckJob`) run by the one sweep: its own process, forked from
the warm server, killed after `timeout` seconds (a row says so, the others still run), its
record appended to `out` as it ends, and `resume` skipping the checks already ok there.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from lmperf.errors import SpecError
from lmperf.questions.doctor.spec import CPU_WORKERS

if TYPE_CHECKING:  # torch and pandas load when the doctor runs, not for `lmperf doctor --help`
    import torch

    from lmperf.core.report import Report
    from lmperf.questions.doctor.checks import Check
    from lmperf.questions.doctor.spec import CheckJob

TIMEOUT_S = 300.0
"""Each check's job is killed after this (default of `timeout`). Its own children give up
sooner: the capped child 120 s (twice on the CPU), flash-triton's 240 s, a torchrun item 240 s."""


def plan_scopes(device: str) -> dict[str, torch.device | str]:
    """Which device each scope's checks run on, or why they are skipped.

    'auto': the CPU's checks, and CUDA's when torch sees a GPU; 'cpu': the CPU's only; 'cuda':
    CUDA's only (SpecError without a GPU). Device-independent checks ('any') run on the CUDA
    device when CUDA's checks run, else on the CPU.
    """
    import torch

    from lmperf.runtime import device as dev

    resolved = dev.resolve_device(device)  # SpecError for 'cuda' without a GPU, or a bad name
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    scopes: dict[str, torch.device | str] = {}
    scopes["cpu"] = "--device cuda: the CPU's paths were not asked for" if device == "cuda" else cpu
    if resolved.type == "cuda":
        scopes["cuda"] = cuda
    elif device == "cpu" and dev.cuda_available():
        scopes["cuda"] = "--device cpu: CUDA's paths were not asked for"
    else:
        build = (f"this torch ({torch.__version__}) is a CPU build" if torch.version.cuda is None
                 else f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees none")
        scopes["cuda"] = f"no CUDA device: {build}"
    scopes["any"] = scopes["cuda"] if isinstance(scopes["cuda"], torch.device) else scopes["cpu"]
    return scopes


def plan_jobs(scopes: dict[str, torch.device | str], names: Sequence[str]) -> list[CheckJob]:
    """The CheckJobs of the checks `names`: one per check, except checks of one runnable scope
    that share a launch (`Check.launches`: one job, so one launch). Jobs that launch processes
    come first, in `registry.LAUNCH_ORDER` (longest first); then the others in table order."""
    import torch

    from lmperf.questions.doctor.spec import CheckJob
    from lmperf.questions.doctor.registry import CHECKS, LAUNCH_ORDER

    groups: dict[tuple[str, str], list[Check]] = {}
    for check in (c for c in CHECKS if c.name in names):
        runs = isinstance(scopes[check.scope], torch.device)
        key = check.launches if runs and check.launches else check.name
        groups.setdefault((check.scope, key), []).append(check)

    def start_rank(checks: list[Check]) -> int:  # sorted() is stable: else the table's order
        first = checks[0]
        runs = isinstance(scopes[first.scope], torch.device)
        return (LAUNCH_ORDER.index(first.launches) if runs and first.launches in LAUNCH_ORDER
                else len(LAUNCH_ORDER))

    def device_of(scope: str) -> str:  # a scope skipped here keeps the device it would check
        where = scopes[scope]  # ('any' always runs somewhere)
        return where.type if isinstance(where, torch.device) else scope

    return [CheckJob(tuple(c.name for c in checks), checks[0].scope, device_of(checks[0].scope))
            for checks in sorted(groups.values(), key=start_rank)]


def doctor(device: str = "auto", *, checks: Sequence[str] | str | None = None,
           out: str | Path | None = None, inline: bool = False, timeout: float | None = None,
           resume: bool = False, progress: bool = False) -> Report:
    """Run the doctor's checks (all, or those named in `checks`) as `lmperf doctor` does, and
    return its Report: one row per check (check, device, status ok / fail / skip, result, why,
    seconds), from one `kind: "doctor"` record per check, appended to `out` as each ends.
    `timeout` defaults to TIMEOUT_S. Three checks run at a time on the CPU, one at a time when
    CUDA's run (they share the GPU). Raises SpecError for an unknown device or check name,
    ResultsFileError for an unwritable `out`.
    """
    from lmperf.core.command import sweep_options

    # First: it starts the warm server, which imports torch while this process plans the jobs.
    options = sweep_options(inline=inline, timeout=TIMEOUT_S if timeout is None else timeout,
                            resume=resume, progress=progress)
    import torch

    from lmperf.core.sweep import run_sweep
    from lmperf.questions.doctor.records import checks_of, skipped_record
    from lmperf.questions.doctor.registry import NAMES
    from lmperf.questions.doctor.report import build_report
    from lmperf.runtime import env as envmod

    wanted = _wanted(checks, NAMES)
    scopes = plan_scopes(device)
    jobs = plan_jobs(scopes, wanted)
    if resume and out is not None and Path(out).exists():
        # A check that cannot run here has its skipped row already: do not append it again.
        from lmperf.results.store import read_records

        recorded = {c for r in read_records(Path(out)) if r.get("kind") == "doctor"
                    for c in checks_of(r)}
        jobs = [j for j in jobs
                if isinstance(scopes[j.scope], torch.device) or not set(j.checks) <= recorded]
    cuda_runs = isinstance(scopes["cuda"], torch.device)
    options.workers = 1 if cuda_runs else CPU_WORKERS
    main = scopes["any"]
    environment = envmod.capture(main if isinstance(main, torch.device) else torch.device("cpu"))

    def precheck(job: CheckJob) -> dict | None:  # a scope that cannot run here: its row says why
        why = scopes[job.scope]
        return None if isinstance(why, torch.device) else skipped_record(
            job.item_spec(job.checks[0]), why, environment)

    # build_report puts the rows in the table's order, not the order the checks finished in
    return build_report(run_sweep(jobs, Path(out) if out is not None else None, options,
                                  precheck=precheck))


def _wanted(checks: Sequence[str] | str | None, names: Sequence[str]) -> list[str]:
    if checks is None:
        return list(names)
    wanted = [checks] if isinstance(checks, str) else list(checks)
    unknown = [c for c in wanted if c not in names]
    if unknown or not wanted:
        raise SpecError(f"unknown check(s) {', '.join(map(repr, unknown)) or '(none given)'}; "
                        f"checks: {', '.join(names)}")
    return wanted
