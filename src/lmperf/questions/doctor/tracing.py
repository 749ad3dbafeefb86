"""Profiling paths: a profiled step with everything attributed to a phase, a CUDA memory
snapshot written and summarised, and Nsight Systems on PATH.

The profile is `lmperf.profile(...)` itself (inline, the `tiny` model, one profiled step), and
its trace is read back with the parser every profile uses (`profile.trace.load_trace`): on the
CPU every operator, on CUDA every kernel, memcpy and memset must land in forward, backward or
the optimizer step.
"""

from __future__ import annotations

import shutil
import subprocess

import pandas as pd

from lmperf.questions.doctor.checks import Context, Outcome, fail, ok, passed, skip

PHASES = ("forward", "backward", "optimizer")


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


def check_profile_cpu(ctx: Context) -> Outcome:
    """A profiled CPU step: every operator attributed to a phase (autograd's thread included)."""
    _, trace = profiled_trace(ctx)
    return attribution(trace.ops, "operators")


def check_profile_cuda(ctx: Context) -> Outcome:
    """A profiled CUDA step: every device activity attributed to a phase through its launch."""
    _, trace = profiled_trace(ctx)
    return attribution(trace.kernels, "kernels")


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
    size_mib = recording.path.stat().st_size / 2**20
    result = (f"{size_mib:.1f} MiB pickle: {summary.events} alloc/free events, peak active "
              f"{summary.peak_active_bytes / 2**20:.1f} MiB, {summary.segments} segments")
    return passed(summary.events > 0 and summary.peak_active_bytes > 0, result,
                  "a recorded step must hold allocation history",
                  events=summary.events, peak_active_bytes=summary.peak_active_bytes)


def check_nsys(ctx: Context) -> Outcome:
    """Nsight Systems: on PATH and answering `nsys --version`, or a skip saying what that means."""
    from lmperf.questions.profile.backends.nsys_commands import nsys_path

    nsys = nsys_path() or shutil.which("nsys")
    if nsys is None:
        return skip("not on PATH: --backend nsys unavailable (torch.profiler unaffected)")
    try:
        proc = subprocess.run([nsys, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return fail(f"{nsys}: {exc}", "nsys must start")
    version = (proc.stdout.strip().splitlines() or ["?"])[-1]
    if proc.returncode != 0:
        return fail(f"{nsys} --version exited {proc.returncode}", "nsys must start")
    note = "" if ctx.device.type == "cuda" else " (it profiles CUDA runs only)"
    return ok(f"{nsys}: {version}", "`lmperf profile --backend nsys` can run" + note,
              path=nsys, version=version)


def check_nsys_capture(ctx: Context) -> Outcome:
    """A real Nsight Systems capture of the tiny train step (`lmperf profile --backend nsys`'s
    own path: the child under nsys, `nsys stats` on its report, the per-phase kernel tables)."""
    from lmperf.questions.profile.backends.nsys import profile_nsys
    from lmperf.questions.profile.backends.nsys_commands import nsys_path
    from lmperf.workload.spec import RunSpec

    if nsys_path() is None:
        return skip("nsys is not on PATH: `lmperf profile --backend nsys` cannot run here")
    spec = RunSpec.from_size("tiny", context=32, batch=2, device="cuda", warmup=1,
                             steps=2)
    result = profile_nsys(spec, ctx.workdir / "doctor_nsys", top=5)
    found = {title.split(": ", 1)[1]: len(df) for title, df in result.tables
             if title.startswith("top kernels (nsys): ")}
    missing = [p for p in PHASES if not found.get(p)]
    shown = ", ".join(f"{p} {n}" for p, n in found.items())
    return passed(not missing, f"top-kernel rows per phase: {shown or 'none'}",
                  "every phase's NVTX range must hold kernels in nsys's report"
                  + (f" (none in {', '.join(missing)})" if missing else ""),
                  rows=found, notes=result.notes[:3])
