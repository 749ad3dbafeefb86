"""What a record offers a comparison: its timed phases (raw samples), tokens/s, peak memory,
and the environment fields that make two runs incomparable when they differ.

Record kinds keep their samples in different places; this module is the one that knows where:
- bench, attention: `metrics["<phase>_ms"]["samples"]` (forward, backward, optimizer, step;
  forward, backward, end_to_end); a bench record pooled over `--rounds` has each sample's round
  in `sample_round`, and its samples are grouped by round;
- train: `metrics["summary"]["step_ms"]["samples"]`;
- profile: `metrics["samples_ms"]["benchmarked"][<phase>]` (the steps timed without the
  profiler; the profiled ones are slowed by it and not compared);
- memory and amp records carry no timing samples: they are reported as not compared.
CPU time of the same phases (CPU runs of bench and train): `metrics["cpu_time"]["<phase>_ms"]`,
with the clock that measured it in `metrics["cpu_time"]["clock"]`.
"""

from __future__ import annotations

import math
import statistics
from lmperf.units import MIB


# Environment fields that should be equal for a comparison to mean what it says: a warning
# names each one that differs (the git commit and lmperf version are reported, not warned
# about: they are often the very change being measured).
ENV_FIELDS: tuple[str, ...] = (
    "device_name", "cpu_model", "cpu_count", "torch", "cuda", "cudnn", "python", "torch_threads",
    "float32_matmul_precision", "cuda_matmul_allow_tf32", "cudnn_allow_tf32", "hostname",
)
VERSION_FIELDS: tuple[str, ...] = ("git_commit", "lmperf")
# Load per CPU above which a CPU timing is not trusted. On the 2-core development machine
# (2026-11-23), 7 of 8 runs that started below 1.2 per CPU timed within 5% of the same spec's
# fastest run (the 8th, 2x slower, caught a burst the 1-minute average had not yet seen), while
# every run that started above 1.5 per CPU was 1.6-3.3x slower.
MAX_LOAD = 1.25
# Fraction of a step's wall time during which the measuring thread was not running (1 - its CPU
# time / wall time, medians) above which the run was loaded while it ran, whatever the load
# average said when it started. One-thread steps on the quiet development machine lose under 1%
# (page faults and the like count as CPU time); with two busy neighbours on two cores, 50-70%.
MAX_OFF_CPU = 0.10
# The CPU clock on which a loaded comparison can be judged: the measuring thread's. The process
# clock of a multi-threaded run also counts the pool's spin-waits, which a neighbour stretches.
JUDGED_CPU_CLOCK = "thread_time"


def _groups(entry: object) -> list[list[float]] | None:
    """The raw samples of a summarize() dict (or a plain list) as groups: one per round when the
    record pooled `--rounds` (`sample_round` beside `samples`), else one. None without any."""
    rounds = entry.get("sample_round") if isinstance(entry, dict) else None
    if isinstance(entry, dict):
        entry = entry.get("samples")
    if not (isinstance(entry, list) and entry and all(isinstance(x, (int, float)) for x in entry)):
        return None
    xs = [float(x) for x in entry]
    if isinstance(rounds, list) and len(rounds) == len(xs):
        by_round: dict[object, list[float]] = {}
        for r, x in zip(rounds, xs):
            by_round.setdefault(r, []).append(x)
        return list(by_round.values())
    return [xs]


def timed_groups(record: dict) -> dict[str, list[list[float]]]:
    """Phase name -> raw samples (ms) of an ok record, grouped by round (one group unless the
    record pooled rounds), in the record's order; {} without any."""
    metrics = record.get("metrics") or {}
    out: dict[str, list[list[float]]] = {}
    for source in (metrics, metrics.get("summary") or {}):
        for key, entry in source.items():
            if key.endswith("_ms") and (groups := _groups(entry)) is not None:
                out.setdefault(key[: -len("_ms")], groups)
    benchmarked = (metrics.get("samples_ms") or {}).get("benchmarked") or {}
    for phase, entry in benchmarked.items():
        if (groups := _groups(entry)) is not None:
            out.setdefault(str(phase), groups)
    return out


def cpu_clock(record: dict) -> str | None:
    """The CPU clock of a record's CPU times ('thread_time', 'process_time'), None without any."""
    cpu = (record.get("metrics") or {}).get("cpu_time")
    return cpu.get("clock") if isinstance(cpu, dict) else None


def cpu_groups(record: dict) -> dict[str, list[list[float]]]:
    """Phase name -> CPU-time samples (ms) of an ok record, grouped by round like
    `timed_groups`; {} without any (CUDA runs, records written before CPU time was kept)."""
    cpu = (record.get("metrics") or {}).get("cpu_time")
    if not isinstance(cpu, dict):
        return {}
    return {key[: -len("_ms")]: groups for key, entry in cpu.items()
            if key.endswith("_ms") and (groups := _groups(entry)) is not None}


def off_cpu(record: dict) -> float | None:
    """1 - median CPU time / median wall time of the record's steps: the share of a step during
    which the measuring thread did not run (other processes had the core). None unless the
    record has both, measured by the measuring thread's own clock (see MAX_OFF_CPU)."""
    if cpu_clock(record) != JUDGED_CPU_CLOCK:
        return None
    wall, cpu = timed_phases(record).get("step"), cpu_groups(record).get("step")
    if not wall or not cpu:
        return None
    wall_median = statistics.median(wall)
    cpu_median = statistics.median(x for g in cpu for x in g)
    return 1.0 - cpu_median / wall_median if wall_median > 0 else None


def timed_phases(record: dict) -> dict[str, list[float]]:
    """Phase name -> all raw samples (ms) of an ok record, in the record's order ({} without)."""
    return {phase: [x for g in groups for x in g] for phase, groups in timed_groups(record).items()}


def tokens_per_s(record: dict) -> float | None:
    """The record's throughput (tokens/s), None when its kind has none."""
    metrics = record.get("metrics") or {}
    for source in (metrics, metrics.get("summary") or {}):
        value = source.get("tokens_per_s")
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
    return None


def peak_memory(record: dict) -> tuple[float | None, str | None]:
    """(MiB, what it is) of the record's memory measurement: the largest per-phase peak of a
    bench record (allocator peak on CUDA, process RSS on the CPU), a train run's peak, or what
    an attention forward leaves alive for backward. (None, None) when there is none."""
    metrics = record.get("metrics") or {}
    memory = metrics.get("memory") or {}
    phases = memory.get("phases") if isinstance(memory, dict) else None
    if isinstance(phases, dict):
        values = [v for p in phases.values() if isinstance(p, dict) for k, v in p.items()
                  if k in ("allocated", "rss") and isinstance(v, (int, float))]
        if values:
            return float(max(values)), memory.get("kind") or "peak"
    peak = (metrics.get("summary") or {}).get("peak_mib")
    if isinstance(peak, (int, float)):
        return float(peak), "train peak"
    before = memory.get("before_backward_bytes") if isinstance(memory, dict) else None
    if isinstance(before, (int, float)):
        return float(before) / MIB, "alive before backward"
    return None, None


def env_values(record: dict, fields: tuple[str, ...] = ENV_FIELDS) -> dict[str, object]:
    """The record's environment fields among `fields` (missing ones left out)."""
    env = record.get("env") or {}
    return {f: env[f] for f in fields if f in env}


def load_average(record: dict) -> float | None:
    """The 1-minute load average captured with the record, if any."""
    value = (record.get("env") or {}).get("load_average_1m")
    return float(value) if isinstance(value, (int, float)) else None


def load_per_cpu(record: dict) -> float | None:
    """The 1-minute load average per CPU when a CPU run started (None on CUDA, where the timings
    are GPU time, or when the record has no load or CPU count). Above 1 the machine had more
    runnable threads than cores (the run's own included): a CPU timing then measures the
    neighbours too (see MAX_LOAD)."""
    env = record.get("env") or {}
    device = env.get("device") or (record.get("spec") or {}).get("device")
    load, cpus = load_average(record), env.get("cpu_count")
    if device != "cpu" or load is None or not isinstance(cpus, int) or cpus <= 0:
        return None
    return load / cpus
