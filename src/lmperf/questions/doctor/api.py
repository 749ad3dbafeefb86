"""`lmperf.doctor(...)`: check, briefly and for real, each path lmperf relies on here; a Report."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable, Sequence

import torch

from lmperf.core.report import Report
from lmperf.questions.doctor.checks import Context, Row, run_checks
from lmperf.questions.doctor.report import build_report, to_record
from lmperf.errors import SpecError


def plan_scopes(device: str, workdir: Path) -> dict[str, Context | str]:
    """Which scopes run on which device, and why the others are skipped.

    'auto': the CPU's checks, and CUDA's when torch sees a GPU; 'cpu': the CPU's only; 'cuda':
    CUDA's only (SpecError without a GPU). Device-independent checks ('any') run on the CUDA
    device when CUDA's checks run, else on the CPU.
    """
    from lmperf.runtime import device as dev

    resolved = dev.resolve_device(device)  # SpecError for 'cuda' without a GPU, or a bad name
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    scopes: dict[str, Context | str] = {}
    if device == "cuda":
        scopes["cpu"] = "--device cuda: the CPU's paths were not asked for"
    else:
        scopes["cpu"] = Context(cpu, workdir)
    if resolved.type == "cuda":
        scopes["cuda"] = Context(cuda, workdir)
    elif device == "cpu" and dev.cuda_available():
        scopes["cuda"] = "--device cpu: CUDA's paths were not asked for"
    else:
        build = (f"this torch ({torch.__version__}) is a CPU build" if torch.version.cuda is None
                 else f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees none")
        scopes["cuda"] = f"no CUDA device: {build}"
    main = scopes["cuda"] if isinstance(scopes["cuda"], Context) else scopes["cpu"]
    scopes["any"] = Context(main.device, workdir) if isinstance(main, Context) else main
    return scopes


def doctor(device: str = "auto", *, checks: Sequence[str] | str | None = None,
           out: str | Path | None = None, progress: bool = False) -> Report:
    """Run the doctor's checks (all, or those named in `checks`) and return its Report: one row
    per check (check, device, status ok / fail / skip, result, why, seconds) and one
    `kind: "doctor"` record ('error' when a check failed), appended to `out` when given.

    `device` is `lmperf doctor --device`: 'auto' (the CPU, and CUDA when present), 'cpu' or
    'cuda'. CUDA's checks are rows marked skip, with the reason, where they cannot run. The CPU
    checks take ~10-20 s (two child processes start, one of them for Triton's interpreter),
    plus a torchrun launch of 2 gloo ranks in the background (the distributed checks): its
    start-up dominates (34 s of a 93 s doctor on a 2-core VM at load 18).
    Raises SpecError for an unknown device or check name, ResultsFileError for an unwritable
    `out`.
    """
    from lmperf.core.launch import cpu_threads
    from lmperf.questions.doctor.registry import CHECKS, NAMES
    from lmperf.results import store
    from lmperf.runtime import device as dev
    from lmperf.runtime import env as envmod

    wanted = _wanted(checks, NAMES)
    if out is not None:
        store.ensure_writable(Path(out))
    report_row = _progress() if progress else None
    with tempfile.TemporaryDirectory(prefix="lmperf-doctor-") as tmp:
        scopes = plan_scopes(device, Path(tmp))
        selected = [c for c in CHECKS if c.name in wanted]
        cuda = scopes["cuda"]
        rng_devices = [dev.cuda_index(cuda.device)] if isinstance(cuda, Context) else []
        # One CPU thread, as every lmperf command (core.vocabulary's policy): the doctor checks
        # the configuration the commands run in. The checks seed torch (the workload does):
        # the caller's random streams are restored afterwards.
        with cpu_threads(1), torch.random.fork_rng(devices=rng_devices):
            rows = run_checks(selected, scopes, report_row)
    main = scopes["any"]
    env_device = main.device if isinstance(main, Context) else torch.device("cpu")
    spec = {"device": device, "checks": list(wanted) if checks is not None else "all"}
    record = to_record([r.as_dict() for r in rows], spec, envmod.capture(env_device))
    if out is not None:
        store.append_record(Path(out), record)
    return build_report([record])


def _wanted(checks: Sequence[str] | str | None, names: Sequence[str]) -> list[str]:
    if checks is None:
        return list(names)
    wanted = [checks] if isinstance(checks, str) else list(checks)
    unknown = [c for c in wanted if c not in names]
    if unknown or not wanted:
        raise SpecError(f"unknown check(s) {', '.join(map(repr, unknown)) or '(none given)'}; "
                        f"checks: {', '.join(names)}")
    return wanted


def _progress() -> Callable[[Row], None]:
    from lmperf.core.command import err

    def report(row: Row) -> None:
        err(f"doctor: {row.check}: {row.outcome.status} ({row.seconds:.1f} s)")

    return report
