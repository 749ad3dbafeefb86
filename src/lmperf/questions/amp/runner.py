"""Running an experiment: options in, ExperimentResult and a results-file record out, plot saved."""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from lmperf.questions.amp import get_experiment
from lmperf.questions.amp.base import ExperimentResult
from lmperf.results.schema import to_jsonable
from lmperf.errors import LmperfError, SpecError
from lmperf.results.schema import make_record
from lmperf.core.outcome import failure
from lmperf.runtime import env as envmod

KIND = "amp"


@dataclass
class Outcome:
    """One experiment run: its result (None if it failed), the record, the plot written."""

    name: str
    result: ExperimentResult | None
    record: dict
    seconds: float
    plot_path: Path | None = None


def option_names(module: ModuleType) -> list[str]:
    """The keyword options of an experiment's run() (everything but `device`)."""
    return [p for p in inspect.signature(module.run).parameters if p != "device"]


def check_options(module: ModuleType, options: dict) -> None:
    """Raise SpecError for an option the experiment does not have."""
    accepted = option_names(module)
    unknown = [k for k in options if k not in accepted]
    if unknown:
        raise SpecError(f"amp {module.NAME}: unknown option(s) {', '.join(unknown)}; accepted: "
                        f"{', '.join(accepted) or 'none'}")


def run_experiment(name: str, device: torch.device, options: dict | None = None,
                   plot_path: Path | None = None) -> Outcome:
    """Run experiment `name` on `device` with `options` (missing ones take run()'s defaults).

    Bad option values raise SpecError. A failure inside the experiment becomes an 'error'
    record (and `result` None) rather than an exception, so `amp all` can go on.
    """
    module = get_experiment(name)
    accepted = option_names(module)
    options = {k: v for k, v in (options or {}).items() if k in accepted}
    environment = envmod.capture(device)
    start = time.perf_counter()
    try:
        result = module.run(device, **options)
    except (ValueError, TypeError) as exc:
        raise SpecError(f"amp {name}: {exc}") from None
    except LmperfError:
        raise
    except Exception as exc:  # a failure of the experiment itself: recorded, not hidden
        seconds = time.perf_counter() - start
        record = make_record(KIND, {"experiment": name, "device": device.type, **to_jsonable(options)},
                             environment=environment, **failure(exc, f"running amp {name}"))
        return Outcome(name, None, record, seconds)
    seconds = time.perf_counter() - start
    spec = {"experiment": name, "device": device.type, **to_jsonable(result.params)}
    record = make_record(KIND, spec, "ok", environment, metrics=result.to_dict() | {"seconds": seconds})
    written = None
    if plot_path is not None and hasattr(module, "plot"):
        plot_path.parent.mkdir(parents=True, exist_ok=True)
        module.plot(result, plot_path)
        written = plot_path
    return Outcome(name, result, record, seconds, written)


