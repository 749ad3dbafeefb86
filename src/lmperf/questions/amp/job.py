"""Running an experiment where the launcher puts it: options in, a results-file record out, plot
saved. Bad options are refused in the parent before anything runs (`check_options`); anything
an experiment raises while it runs, torch's ValueErrors included, is an 'error' row."""

from __future__ import annotations

import inspect
import time
from pathlib import Path
from types import ModuleType

import torch

from lmperf.core.outcome import failure
from lmperf.errors import SpecError
from lmperf.questions.amp import get_experiment
from lmperf.questions.amp.spec import AmpSpec
from lmperf.results.schema import make_record, to_jsonable
from lmperf.runtime import env as envmod

KIND = "amp"


def option_names(module: ModuleType) -> list[str]:
    """The keyword options of an experiment's run() (everything but `device`)."""
    return [p for p in inspect.signature(module.run).parameters if p != "device"]


def check_options(module: ModuleType, options: dict, device: torch.device) -> None:
    """Raise SpecError for an option the experiment does not have, or a value it refuses
    (its `check`, which runs nothing)."""
    accepted = option_names(module)
    unknown = [k for k in options if k not in accepted]
    if unknown:
        raise SpecError(f"amp {module.NAME}: unknown option(s) {', '.join(unknown)}; accepted: "
                        f"{', '.join(accepted) or 'none'}")
    try:
        module.check(device, **options)
    except SpecError as exc:
        raise SpecError(f"amp {module.NAME}: {exc}") from None


def run_job(spec: AmpSpec) -> dict:
    """Run `spec`'s experiment here and return its record ('ok', or 'oom' / 'error' with the
    reason: a failure inside the experiment never raises)."""
    device = torch.device(spec.device)
    module = get_experiment(spec.experiment)
    options = spec.kwargs()
    environment = envmod.capture(device)
    head = {"experiment": spec.experiment, "device": device.type}
    start = time.perf_counter()
    try:
        result = module.run(device, **options)
        if spec.plot is not None and hasattr(module, "plot"):
            Path(spec.plot).parent.mkdir(parents=True, exist_ok=True)
            module.plot(result, Path(spec.plot))
    except Exception as exc:  # a failure of the experiment itself: recorded, not hidden
        return make_record(KIND, head | to_jsonable(options), env=environment,
                           **failure(exc, f"running amp {spec.experiment}"))
    seconds = time.perf_counter() - start
    metrics = result.to_dict() | {"seconds": seconds, "plot": spec.plot}
    return make_record(KIND, head | to_jsonable(result.params), "ok", environment,
                       metrics=metrics)
