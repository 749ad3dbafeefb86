"""Recording a CUDA memory snapshot around the measured steps (allocator history on, steps, dump;
a dump on out-of-memory too). The file is read by `snapshot_read` (no GPU needed there) and
opens in pytorch.org/memory_viz.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from lmperf.core.outcome import first_line
from lmperf.errors import SpecError
from lmperf.runtime import device as dev
from lmperf.workload.spec import RunSpec
from lmperf.workload.steps import NO_OBSERVER


@dataclass
class SnapshotRecording:
    """What `record_snapshot` wrote.

    status: 'ok' (the measured steps ran; `path` holds them) or 'oom' (the run ran out of
        memory; `oom_path` holds the allocator's state at that moment, and `path` is None).
    steps_recorded: measured steps inside the recorded history.
    """

    status: str
    path: Path | None
    oom_path: Path | None
    steps_recorded: int
    message: str = ""


def oom_path_for(path: Path) -> Path:
    """Where the OOM snapshot of a recording to `path` goes: `<stem>_oom<suffix>` beside it."""
    return path.with_name(f"{path.stem}_oom{path.suffix or '.pickle'}")


def record_snapshot(spec: RunSpec, path: str | Path, *, overwrite: bool = False
                    ) -> SnapshotRecording:
    """Run `spec` on CUDA with allocator history recorded around its measured steps only, and
    dump the snapshot pickle to `path` (open it in pytorch.org/memory_viz, or summarise it with
    `summarize_snapshot`).

    Order: prepare (model, batch, optimizer) and `spec.warmup` steps unrecorded, so the history
    holds the steady-state steps and not one-off allocations of the first step; then history on,
    `spec.steps` steps, dump, history off. A dump on out-of-memory is armed for the whole run
    (during warm-up the snapshot has the allocator's state but no history). Raises SpecError on
    the CPU or when `path` exists and `overwrite` is False.
    """
    path = Path(path)
    device = _device_for(spec)
    reason = dev.memory_history_unsupported_reason(device)
    if reason:
        raise SpecError(f"memory snapshots need a CUDA device; {reason}. Run with --device cuda on "
                        "a GPU machine, or summarise an existing snapshot with --snapshot FILE")
    oom_path = oom_path_for(path)
    for p in (path, oom_path):
        if p.exists() and not overwrite:
            raise SpecError(f"{p} exists; refusing to overwrite it (move it away or pass overwrite)")
    # Imported when recording: loading and summarising a snapshot (any machine) need neither.
    from lmperf.model.checks import check_output
    from lmperf.workload.build import prepare
    from lmperf.runtime.precision import get_regime, matmul_precision, unsupported_reason

    regime = get_regime(spec.precision)
    if (why := unsupported_reason(regime, device)):
        raise SpecError(why)
    path.parent.mkdir(parents=True, exist_ok=True)
    dev.on_oom_dump(device, oom_path)
    recorded = 0
    try:
        with matmul_precision(regime):
            prepared = prepare(spec, device, regime)
            check_output(prepared.state.model, prepared.state.inputs, prepared.state.autocast,
                         spec.vocab_size, spec.model)
            for _ in range(spec.warmup):
                prepared.step(prepared.state, NO_OBSERVER)
            dev.synchronize(device)  # warm-up frees must land before the history starts
            dev.start_memory_history(device)
            try:
                for _ in range(spec.steps):
                    prepared.step(prepared.state, NO_OBSERVER)
                    recorded += 1
                dev.synchronize(device)
                dev.dump_memory_snapshot(device, path)
            except Exception as exc:
                # Dump before the `finally` stops the history: stopping it drops what it holds.
                _dump_after_oom(exc, device, oom_path)
                raise
            finally:
                dev.stop_memory_history(device)
    except Exception as exc:
        if not dev.is_oom(exc):
            raise
        _dump_after_oom(exc, device, oom_path)  # OOM before the history: the state only
        return SnapshotRecording("oom", None, oom_path, recorded, f"out of memory after "
                                 f"{recorded} recorded steps: {first_line(exc)}")
    finally:
        dev.cancel_oom_dump()
        dev.free_memory(device)
    return SnapshotRecording("ok", path, None, recorded,
                             f"{recorded} steps recorded (max {dev.SNAPSHOT_MAX_ENTRIES} events)")


def _device_for(spec: RunSpec) -> torch.device:
    """The spec's device (a seam: the tests run the recording's steps on the CPU)."""
    return torch.device(spec.device)


def _dump_after_oom(exc: BaseException, device: torch.device, oom_path: Path) -> None:
    """After an OOM, dump now unless the OOM observer already did (a torch without the hook)."""
    if dev.is_oom(exc) and not oom_path.exists():
        dev.dump_memory_snapshot(device, oom_path)
