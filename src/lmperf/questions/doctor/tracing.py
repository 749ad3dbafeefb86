"""Profiling paths: a profiled step with everything attributed to a phase, and a CUDA memory
snapshot written and summarised.

The profile is `lmperf.profile(...)` itself (inline, the `tiny` model, one profiled step), and
its trace is read back with the parser every profile uses (`profile.trace.load_trace`): on the
CPU every operator, on CUDA every kernel, memcpy and memset must land in forward, backward or
the optimizer step.
"""

from __future__ import annotations

import pandas as pd

from lmperf.questions.doctor.checks import Context, Outcome, fail, passed
from lmperf.questions.doctor.timing import PHASES
from lmperf.units import MIB


def profiled_trace(ctx: Context):
    """Profile one train step of `tiny` on ctx's device (inline) and parse its trace; returns
    (Report, Trace)."""
    import lmperf.questions.profile
    from lmperf.questions.profile.trace import load_trace

    path = ctx.workdir / f"profile_{ctx.device.type}.json"
    report = lmperf.profile(size="tiny", context=32, batch=2, warmup=1, steps=1, inline=True,
                            device=ctx.device.type, trace=path)
    record = report.records[0]
    if record["status"] != "ok":
        raise RuntimeError(f"the profile is a {record['status']} row: {record['message']}")
    return report, load_trace(path)


def attribution(events: pd.DataFrame, what: str) -> Outcome:
    """ok when every event of the table has a phase among PHASES."""
    phase = events["phase"] if len(events) else pd.Series(dtype=object)
    counts = phase.value_counts(dropna=False)
    stray = int(len(events) - sum(int(counts.get(p, 0)) for p in PHASES))
    parts = ", ".join(f"{p} {int(counts.get(p, 0))}" for p in PHASES)
    result = f"{len(events)} {what} in 1 profiled step: {parts}, elsewhere {stray}"
    if not len(events):
        return fail(result, f"the trace must hold {what}")
    return passed(stray == 0 and all(counts.get(p, 0) for p in PHASES), result,
                  f"every {what[:-1]} in a phase (autograd's thread too)",
                  counts={str(k): int(v) for k, v in counts.items()}, stray=stray)


def check_profile(ctx: Context) -> Outcome:
    """A profiled step: on the CPU every operator attributed to a phase (autograd's thread
    included), on CUDA every device activity (through its launch)."""
    _, trace = profiled_trace(ctx)
    if ctx.device.type == "cuda":
        return attribution(trace.kernels, "kernels")
    return attribution(trace.ops, "operators")


def check_snapshot(ctx: Context) -> Outcome:
    """A CUDA memory snapshot of the tiny train step: written (history on), read back with the
    restricted unpickler and summarised (events, peak)."""
    from lmperf.questions.memory.snapshot_read import summarize_snapshot
    from lmperf.questions.memory.snapshot_record import record_snapshot
    from lmperf.workload.spec import RunSpec

    spec = RunSpec.from_size("tiny", context=32, batch=2, device="cuda", warmup=1,
                             steps=1)
    path = ctx.workdir / "snapshot.pickle"
    recording = record_snapshot(spec, path, overwrite=True)
    if recording.status != "ok" or recording.path is None:
        return fail(recording.message, "recording one step must succeed")
    summary = summarize_snapshot(recording.path)
    size_mib = recording.path.stat().st_size / MIB
    result = (f"{size_mib:.1f} MiB pickle: {summary.events} alloc/free events, peak active "
              f"{summary.peak_active_bytes / MIB:.1f} MiB, {summary.segments} segments")
    return passed(summary.events > 0 and summary.peak_active_bytes > 0, result,
                  "a recorded step must hold allocation history",
                  events=summary.events, peak_active_bytes=summary.peak_active_bytes)
