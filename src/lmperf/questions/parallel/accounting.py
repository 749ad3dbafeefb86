"""Communication accounting of profiled steps: time, overlap, exposure and bytes, per step (HTA's
definitions over one step's window; where each interval comes from on gloo and on NCCL, and why
collective time is not transfer time: docs/commands/dist.md, "Communication accounting")."""

from __future__ import annotations

import bisect
import json
import math
from pathlib import Path

from lmperf.estimate.formulas import bus_factor

STEP_RANGE = "lmperf.dist.step"
DEVICE_RANGE_CAT = "gpu_user_annotation"  # Kineto's copy of a host range on a device stream
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
WAIT_NOTE = ("collective time includes waiting for the peers (an NCCL kernel spins from its "
             "launch until the slowest rank arrives; a gloo collective blocks its thread): "
             "it is not transfer time")
_ELEMENT_BYTES = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8,
                  "int": 4, "signed char": 1, "unsigned char": 1, "bool": 1, "short int": 2}


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merge overlapping [start, end) intervals; sorted and disjoint."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def length(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of `intervals`."""
    return sum(end - start for start, end in union(intervals))


def clip(intervals: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    """The parts of `intervals` inside [lo, hi)."""
    return [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi]


def overlap_split(comm: list[tuple[float, float]], compute: list[tuple[float, float]]) -> dict:
    """{'comm', 'compute', 'overlap', 'exposed'} lengths (same unit as the intervals)."""
    c, k = length(comm), length(compute)
    both = length(comm + compute)
    overlap = c + k - both
    return {"comm": c, "compute": k, "overlap": overlap, "exposed": c - overlap}


def innermost(events: list[dict]) -> list[tuple[float, float]]:
    """Intervals of the events that contain no other event of their thread (the leaves of each
    thread's nesting of ops)."""
    out = []
    by_thread: dict[object, list[tuple[float, float]]] = {}
    for e in events:
        start = float(e["ts"])
        by_thread.setdefault(e.get("tid"), []).append((start, start + float(e["dur"])))
    for spans in by_thread.values():
        spans.sort(key=lambda s: (s[0], -s[1]))  # a parent before the children it holds
        for (start, end), nxt in zip(spans, spans[1:] + [(float("inf"), float("inf"))]):
            if not (nxt[0] < end and nxt[1] <= end):  # the next op is not nested in this one
                out.append((start, end))
    return out


def collective_of(event_name: str) -> str:
    """'gloo:all_reduce' / 'nccl:_all_gather_base' -> a COLLECTIVES name (or the raw name)."""
    raw = event_name.split(":", 1)[1].lstrip("_").lower()
    for key, name in (("reduce_scatter", "reduce_scatter"), ("allgather", "all_gather"),
                      ("all_gather", "all_gather"), ("allreduce", "all_reduce"),
                      ("all_reduce", "all_reduce"), ("broadcast", "broadcast"),
                      ("alltoall", "all_to_all"), ("all_to_all", "all_to_all")):
        if key in raw:
            return name
    return raw


def message_bytes(event: dict, n: int) -> tuple[str, int]:
    """(collective, S in bytes) of one `gloo:` / `nccl:` event from its recorded inputs."""
    args = event.get("args", {})
    dims, types = args.get("Input Dims") or [], args.get("Input type") or []
    collective = collective_of(event["name"])
    size = sum(math.prod(map(int, d)) * _ELEMENT_BYTES.get(t, 4) for d, t in zip(dims, types)
               if isinstance(d, list))
    if collective == "all_gather":  # the inputs are this rank's shards; S is the whole array
        size *= n
    return collective, size


def kernels_by_launch(events: list[dict], steps: list[tuple[float, float]]) -> tuple[list[list[dict]], int]:
    """The kernels of each step, placed by their launch: the host call (`cuda_runtime` /
    `cuda_driver`, any thread) with the kernel's correlation id must start inside the step's
    [start, end). `steps` are sorted and disjoint. Returns (kernels per step, kernels whose
    launch is not in the trace)."""
    launched = {(e.get("args") or {}).get("correlation"): float(e["ts"])
                for e in events if e.get("cat") in LAUNCH_CATS}
    starts = [lo for lo, _ in steps]
    out: list[list[dict]] = [[] for _ in steps]
    orphans = 0
    for k in events:
        if k.get("cat") != "kernel":
            continue
        ts = launched.get((k.get("args") or {}).get("correlation"))
        if ts is None:
            orphans += 1
            continue
        i = bisect.bisect_right(starts, ts) - 1
        if i >= 0 and ts < steps[i][1]:
            out[i].append(k)
    return out, orphans


def analyse(trace: str | Path | dict, n: int, device_type: str = "cpu",
            step_range: str = STEP_RANGE) -> dict:
    """Per profiled step: comm / compute / overlap / exposed milliseconds and bytes by
    collective, from a Chrome trace (a path or the loaded JSON). `step_range` names the host
    range of a step (lmperf's own by default). Raises ValueError when the trace holds none."""
    data = trace if isinstance(trace, dict) else json.loads(Path(trace).read_text(encoding="utf-8"))
    events = [e for e in data.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    span = lambda e: (float(e["ts"]), float(e["ts"]) + float(e["dur"]))  # noqa: E731
    host = [e for e in events if e.get("cat") != DEVICE_RANGE_CAT]
    steps = sorted(span(e) for e in host if e["name"] == step_range)
    if not steps:
        raise ValueError(f"the trace holds no {step_range!r} range")
    issued = [e for e in host if e["name"].startswith(("gloo:", "nccl:"))]
    if device_type == "cuda":
        per_kernels, orphans = kernels_by_launch(events, steps)
        is_comm = lambda k: "nccl" in k["name"].lower()  # noqa: E731
        splits = [overlap_split([span(k) for k in ks if is_comm(k)],
                                [span(k) for k in ks if not is_comm(k)]) for ks in per_kernels]
        source = ("torch.profiler: NCCL kernels vs other kernels, each in the step that launched "
                  "it, in full")
    else:
        # gloo's worker threads run the collectives; send / recv run on the calling thread,
        # whose ops are the step's compute
        comm_threads = {e.get("tid") for e in issued
                        if collective_of(e["name"]) not in ("send", "recv")}
        comm = [span(e) for e in issued]
        ops = [e for e in events if e.get("cat") == "cpu_op" and e.get("tid") not in comm_threads
               and not e["name"].startswith("c10d::")]
        compute = innermost(ops)
        splits = [overlap_split(clip(comm, lo, hi), clip(compute, lo, hi)) for lo, hi in steps]
        orphans = 0
        source = "torch.profiler: gloo:* events on gloo's threads vs CPU ops on the others"
    per_step = []
    for (lo, hi), split in zip(steps, splits):
        moved: dict[str, dict] = {}
        for e in issued:
            if lo <= float(e["ts"]) < hi:
                collective, size = message_bytes(e, n)
                entry = moved.setdefault(collective, {"calls": 0, "bytes": 0, "bus_bytes": 0.0})
                entry["calls"] += 1
                entry["bytes"] += size
                factor = bus_factor(collective, n) if collective in _FACTORS else 1.0
                entry["bus_bytes"] += size * factor
        per_step.append({**{f"{k}_ms": v / 1e3 for k, v in split.items()},
                         "step_ms": (hi - lo) / 1e3, "collectives": moved,
                         "bus_bytes": sum(m["bus_bytes"] for m in moved.values())})
    return {"source": source, "note": WAIT_NOTE, "unattributed_kernels": orphans,
            "steps": per_step}


_FACTORS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
