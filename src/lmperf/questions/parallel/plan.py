"""From a request (lists, device defaults) to checked jobs, before any rank starts.

Everything that can be wrong with the input is found here: unknown collectives or strategies,
sizes that do not parse, world sizes the machine cannot hold (NCCL needs a GPU per rank).
`--resume` is applied per item: a job keeps only its items without an 'ok' record in the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

from lmperf.core.vocabulary import as_list, device_defaults, resolve_threads
from lmperf.questions.parallel.spec import COLLECTIVES, STRATEGIES, CommJob, TrainJob
from lmperf.errors import SpecError
from lmperf.validate import choice

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20,
          "gib": 2**30}


def parse_size(text: str | int) -> int:
    """'1KiB' -> 1024, '1MB' -> 1e6, '4096' -> 4096 bytes; SpecError otherwise."""
    if isinstance(text, int) and not isinstance(text, bool):
        value, unit = text, ""
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
        if not match or match.group(2).lower() not in _UNITS:
            raise SpecError(f"cannot read size {text!r}: use bytes or a unit like 1KiB, 16MiB, 1MB, 1GB")
        value, unit = float(match.group(1)), match.group(2).lower()
    size = int(value * _UNITS[unit])
    if size <= 0:
        raise SpecError(f"size must be positive, got {text!r}")
    return size


@dataclass
class DistPlan:
    """The jobs of one request and what to tell the user."""

    jobs: list = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _device(device: str):
    from lmperf.runtime import device as dev

    return dev.resolve_device(device)


def _world_sizes(values: Sequence[int] | int | None, default: object, device_type: str,
                 what: str) -> list[int]:
    sizes = as_list(values) or list(default)  # type: ignore[arg-type]
    if sizes == ["local"]:  # CUDA default: every local GPU count from 2 up
        count = _gpu_count()
        sizes = list(range(2, count + 1)) or [1]
        if what == "train":
            sizes = [1, count] if count > 1 else [1]
    out = []
    for n in sizes:
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise SpecError(f"world size must be a positive integer, got {n!r}")
        if device_type == "cuda":
            gpus = _gpu_count()
            if n > gpus:
                raise SpecError(f"world size {n} needs {n} GPUs (one per rank with NCCL); "
                                f"this machine has {gpus}")
        out.append(n)
    return list(dict.fromkeys(out))


def plan_dist(what: str = "all", *, world_size: Sequence[int] | int | None = None,
              collective: Sequence[str] | str | None = None,
              sizes: Sequence[str | int] | str | int | None = None, dtype: str = "fp32",
              iters: int = 20, strategy: Sequence[str] | str | None = None,
              size: str | None = None, context: int | None = None, batch: int | None = None,
              warmup: int | None = None, steps: int | None = None, profile_steps: int = 2,
              lr: float = 1e-3, bucket_mb: float = 1.0, compute_dtype: str = "fp32",
              seed: int = 0, device: str = "auto",
              threads: int | None = None, timeout: float | None = None,
              course: str | None = None, vocab_size: int | None = None,
              max_memory_gib: float | None = None, precision: str | None = None,
              checkpoint: str | int = "none", grad_accum: int = 1, attention: str | None = None,
              reference: bool = True, **layout: object) -> DistPlan:
    """Check a request and build its jobs: one per (command, world size). `what` is 'comm',
    'train' or 'all' (both). None takes the device's default (core.vocabulary.DEFAULTS["dist"]).
    `layout`: train's layout flags (tp, pp, cp, dp_replicate, pp_schedule, pp_virtual,
    micro_batch), each one value or a list (a sweep): see `layout_items`."""
    from lmperf.core.rank import DEFAULT_TIMEOUT_S

    if what not in ("all", "comm", "train"):
        raise SpecError(f"unknown dist command {what!r}; accepted: comm, train (or none: both)")
    dev_ = _device(device)
    defaults = device_defaults("dist", dev_.type)
    backend = "nccl" if dev_.type == "cuda" else "gloo"
    if max_memory_gib is not None and not max_memory_gib > 0:
        raise SpecError(f"--max-memory-gib must be positive, got {max_memory_gib!r}")
    common = dict(backend=backend, device=dev_.type, threads=resolve_threads(threads, dev_.type),
                  timeout_s=float(timeout) if timeout is not None else DEFAULT_TIMEOUT_S,
                  max_memory_gib=float(max_memory_gib or 0.0))
    plan = DistPlan()
    if what in ("all", "comm"):
        names = as_list(collective) or list(COLLECTIVES)
        byte_sizes = tuple(dict.fromkeys(parse_size(s) for s in (as_list(sizes) or defaults["sizes"])))
        for n in _world_sizes(world_size, defaults["comm_world_size"], dev_.type, "comm"):
            if n < 2:
                plan.notes.append("dist comm: world size 1 has nothing to communicate; skipped")
                continue
            plan.jobs.append(CommJob(world_size=n, collectives=tuple(names), sizes=byte_sizes,
                                     dtype=dtype, warmup=5 if warmup is None else warmup,
                                     iters=iters, **common))
    unknown = set(layout) - set(LAYOUT_FLAGS)
    if unknown:
        raise SpecError(f"unknown keyword(s) for dist: {', '.join(sorted(unknown))}")
    if what == "comm" and any(as_list(v) for v in layout.values()):
        raise SpecError("the layout flags (--tp, --pp, ...) are dist train's")
    if what in ("all", "train"):
        plan.jobs += _train_jobs(plan, world_size, strategy, size, context, batch, warmup, steps,
                                 profile_steps, lr, bucket_mb, compute_dtype, seed,
                                 defaults, dev_.type, common, course, vocab_size,
                                 dict(precision=precision or "fp32", checkpoint=checkpoint,
                                      grad_accum=grad_accum, attention=attention or "naive",
                                      reference=reference), layout)
    return plan


def _train_jobs(plan: DistPlan, world_size, strategy, size, context, batch, warmup, steps,
                profile_steps, lr, bucket_mb, compute_dtype, seed, defaults,
                device_type, common, course, vocab_size, step, layout) -> list[TrainJob]:
    from lmperf.workload.spec import RunSpec

    from lmperf.model.presets import DEFAULT_COURSE, require_plain

    require_plain(size or defaults["size"], course or DEFAULT_COURSE, "lmperf dist train")
    shape = RunSpec.from_size(size or defaults["size"], course or DEFAULT_COURSE,
                              context=context or defaults["context"],
                              **({"vocab_size": vocab_size} if vocab_size else {}))
    fixed = dict(size=shape.size, d_model=shape.d_model, num_layers=shape.num_layers,
                 num_heads=shape.num_heads, d_ff=shape.d_ff, vocab_size=shape.vocab_size,
                 context=shape.context, batch=batch or defaults["batch"],
                 warmup=defaults["warmup"] if warmup is None else warmup,
                 steps=steps or defaults["steps"], profile_steps=profile_steps, lr=lr,
                 seed=seed, bucket_mb=bucket_mb, compute_dtype=compute_dtype,
                 course=shape.course, **step, **common)
    combos = layout_combinations(layout)
    if world_size is None and any(_degrees(c) > 1 for c in combos):
        world_size = [max(_degrees(c) for c in combos)]  # the layout's ranks, no more
    jobs = []
    for n in _world_sizes(world_size, defaults["train_world_size"], device_type, "train"):
        mine = layout_items(plan, n, as_list(strategy), combos, fixed)
        if mine:
            jobs.append(TrainJob(world_size=n, strategies=tuple(mine), **fixed))
    if not jobs:
        raise SpecError("nothing to train: 'single' runs at world size 1, every other strategy "
                        "at world sizes above 1")
    return jobs


LAYOUT_FLAGS = ("tp", "pp", "cp", "dp_replicate", "pp_schedule", "pp_virtual", "micro_batch")


def layout_combinations(layout: dict) -> list[dict]:
    """Every combination of the layout flags' values (a flag not given: its one default; a
    looped schedule's stages per rank: 2 unless given)."""
    from itertools import product

    from lmperf.estimate.layout import LOOPED

    values = {k: as_list(layout.get(k)) or [None] for k in LAYOUT_FLAGS}
    out = []
    for combo in product(*values.values()):
        c = dict(zip(LAYOUT_FLAGS, combo))
        c = {k: (1 if v is None and k not in ("pp_schedule", "pp_virtual") else v)
             for k, v in c.items()}
        if c["pp_virtual"] is None:
            c["pp_virtual"] = 2 if c["pp"] > 1 and str(c["pp_schedule"]) in LOOPED else 1
        out.append(c)
    return out


def _degrees(combo: dict) -> int:
    return combo["tp"] * combo["pp"] * combo["cp"] * combo["dp_replicate"]


def layout_items(plan: DistPlan, n: int, strategies: list[str], combos: list[dict],
                 fixed: dict) -> list[str]:
    """The items (items.Item keys) of `n` ranks: each layout with its strategies (plain data
    parallelism: the strategies given, default all; a layout: 'none' where it leaves one
    replica, else the strategies given, default fsdp2). A combination dist train cannot run is
    refused (SpecError) when it is the only one, else skipped with a note."""
    from lmperf.estimate.layout import Layout
    from lmperf.questions.parallel.items import (NO_STRATEGY, WITH_LAYOUT, Item, check,
                                                 check_schedule)

    out: list[str] = []
    refused: list[str] = []
    for c in combos:
        try:
            lay = Layout(n, c["tp"], c["pp"], c["cp"], c["dp_replicate"], c["pp_schedule"],
                         c["pp_virtual"])
        except SpecError as exc:
            refused.append(f"{n} ranks: {exc}")
            continue
        if not Item("", lay).is_layout:  # one data-parallel group over every rank
            names = [s for s in (strategies or list(STRATEGIES)) if (s == "single") == (n == 1)]
            for s in names:
                choice("strategy", s, STRATEGIES)
            out += [s for s in names if s not in out]
            continue
        if lay.dp == 1 and strategies:
            plan.notes.append(f"{lay.label()} on {n} ranks leaves one data-parallel replica: "
                              f"--strategy {' '.join(strategies)} not used there")
        names = [NO_STRATEGY] if lay.dp == 1 else strategies or list(WITH_LAYOUT)
        for s in names:
            item = Item(s, lay, c["micro_batch"])
            try:
                check(item, num_layers=fixed["num_layers"], num_heads=fixed["num_heads"],
                      context=fixed["context"], batch=fixed["batch"],
                      grad_accum=fixed["grad_accum"], checkpoint=fixed["checkpoint"],
                      compute_dtype=fixed["compute_dtype"], device=fixed["device"])
                check_schedule(item, fixed["batch"])
            except SpecError as exc:
                refused.append(str(exc))
                continue
            if item.key() not in out:
                out.append(item.key())
    if refused and (len(combos) == 1 or not out):  # a sweep skips what it cannot run
        raise SpecError(refused[0])
    plan.notes += [f"skipped: {why}" for why in refused]
    return out


def _gpu_count() -> int:
    """GPUs this process may use (torch respects CUDA_VISIBLE_DEVICES)."""
    from lmperf.runtime.device import cuda_device_count

    return cuda_device_count()
