"""`lmperf.plan(...)`: the fastest configuration that fits, on GPUs you may not have; a Report."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from lmperf.core.command import err
from lmperf.core.report import Report
from lmperf.errors import SpecError
from lmperf.model.presets import DEFAULT_COURSE
from lmperf.questions.plan.spec import CONTEXT, GLOBAL_BATCH


def plan(size: str | None = None, *, model: str | None = None, gpu: str | None = None,
         gpus: int = 1, gpus_per_node: int = 8, gib: float | None = None, device: str = "auto",
         context: int = CONTEXT, global_batch: int = GLOBAL_BATCH,
         precision: Sequence[str] | str | None = None,
         checkpoint: Sequence[str | int] | str | int | None = None, attention: str = "sdpa",
         host_us: float | None = None, confirm: int = 0, course: str = DEFAULT_COURSE,
         out: str | Path | None = None, timeout: float | None = None,
         top: int = 10, tp: Sequence[int] | int | None = None,
         pp: Sequence[int] | int | None = None, cp: Sequence[int] | int | None = None,
         dp_replicate: Sequence[int] | int | None = None,
         pp_schedule: Sequence[str] | str | None = None,
         pp_virtual: Sequence[int] | int | None = None,
         micro_batch: Sequence[int] | int | None = None,
         async_tp: Sequence[bool | str] | bool | str | None = None,
         compile: Sequence[bool | str] | bool | str | None = None,
         float8: Sequence[str] | str | None = None,
         node_bandwidth: float | None = None) -> Report:
    """Search precision x activation checkpointing x sharding x micro-batch for `size` (a
    preset of `course`) or `model` ("package.module:factory") on `gpus` GPUs of `gpu` (a name
    of the peak table: H100-SXM, A100-80GB, ...; `gib`: another memory budget per GPU) at
    `context` tokens and `global_batch` sequences per step, and rank what fits by predicted step
    time. `device` "cpu" plans for this machine's ranks (gloo; `gib` required), "auto" for `gpu`
    when named. `precision`: bf16-mixed and bf16-fsdp on GPUs (default both), fp32 (default) and
    bf16-mixed on the CPU (its time model ranks bf16-mixed 1.5-2x too fast, docs/accuracy.md);
    `checkpoint`: policies (none, full, op, every-K, G blocks a group; default none op full,
    torchtitan's); `compile` (False / True, 'off' / 'on'; default on: off is never faster here)
    and `float8` ('none', 'tensorwise', 'rowwise'; default none and rowwise where the GPU has
    FP8 tensor cores) are searched as the layout's dimensions are. `confirm` K > 0: runs K plans spread over the ranking at their micro-batch b and b + 1
    (on `gpus` gloo ranks of this CPU, or with `gpus` 1 each as a job of its own on the CPU or
    the GPU at hand) and scores the plan (records of kind 'plan' with planned and measured side
    by side, then a summary). Records are appended to `out` when given; a multi-GPU plan's
    winner records its torchtitan 0.3 command line, and its config module is written beside
    the records where it needs one. `top` (> 0): distinct plans shown.
    The layout (`estimate.layout.Layout`): `tp`, `pp`, `cp`, `dp_replicate` (degrees),
    `pp_schedule` (torch's names, any case), `pp_virtual` (stages per rank), `micro_batch`,
    `async_tp` (False / True, or 'off' / 'on'): each one value or several; a dimension not given
    is searched over all its values (one value each: "how fast will my current job run?"), and
    what the search leaves out is said with its reason. `node_bandwidth`: GB/s per GPU between
    nodes (default 50).
    Nothing runs for the plan itself: every figure is PREDICTED (see each record's method).
    Raises SpecError for bad input."""
    from lmperf.core.vocabulary import as_list
    from lmperf.estimate.host import local_gpu
    from lmperf.questions.plan import job
    from lmperf.questions.plan.report import build_report
    from lmperf.questions.plan.spec import CPU_DEFAULT, CUDA_PRECISIONS, PlanSpec
    from lmperf.results.store import append_record, ensure_writable
    from lmperf.runtime import device as dev
    from lmperf.validate import positive_int

    if device not in ("auto", "cpu", "cuda"):
        raise SpecError(f"unknown device {device!r}; accepted: auto, cpu, cuda")
    positive_int("--top", top)
    on_cpu = device == "cpu" or (device == "auto" and gpu is None and gib is not None
                                  and not dev.cuda_available())
    if on_cpu and gpu is not None:
        raise SpecError("--gpu names a target GPU; --device cpu plans for this CPU's ranks")
    if gpu is None and not on_cpu:
        gpu = _local_gpu()
    precisions = tuple([precision] if isinstance(precision, str) else precision or
                       (CPU_DEFAULT if on_cpu else CUDA_PRECISIONS))
    if gpus == 1 and precision and "bf16-fsdp" in precisions:
        raise SpecError("bf16-fsdp is FSDP's mixed-precision policy and one GPU runs no FSDP: "
                        "plan bf16-mixed (--precision bf16-mixed)")
    groups = tuple(as_list(checkpoint) or ("none", "op", "full"))
    spec = PlanSpec(size=None if model and not size else (size or "mini"), context=context,
                    global_batch=global_batch, gpus=gpus, course=course, model=model, gpu=gpu,
                    device="cpu" if on_cpu else "cuda", gpus_per_node=gpus_per_node, gib=gib,
                    precisions=precisions, checkpoints=groups, attention=attention,
                    host_us=host_us, node_bandwidth=node_bandwidth,
                    searched=_searched(tp=tp, pp=pp, cp=cp, dp_replicate=dp_replicate,
                                       pp_schedule=pp_schedule, pp_virtual=pp_virtual,
                                       micro_batch=micro_batch, async_tp=async_tp,
                                       compile=compile, float8=float8))
    here = on_cpu or (gpus == 1 and local_gpu(gpu))  # "h100-sxm", "H100" name the same
    if confirm < 0 or (confirm and not here):
        raise SpecError(f"--confirm K runs K >= 1 plans (got {confirm}) here: on this CPU's "
                        "ranks (--device cpu --gib G) or the one GPU at hand (--gpus 1); on "
                        "other GPUs, run the winner's command")
    path = Path(out) if out is not None else None
    if path is not None:
        ensure_writable(path)
    err(f"planning {spec.size or spec.model} for {gpus} x {gpu or 'this CPU'} ...")
    records = job.records(spec, _progress())
    winner = records[0]  # ranked: the first fits, or nothing does
    if gpus > 1 and spec.device == "cuda" and winner["metrics"]["fits"]:
        from lmperf.questions.plan.torchtitan import write_beside

        # torchtitan 0.3's line (and its config module beside the records, where it needs one)
        winner["metrics"].update(write_beside(winner["spec"], path))
    for r in records if path is not None else ():  # kept before --confirm's minutes start
        append_record(path, r)
    if confirm:
        rows = [{**r["spec"], **r["metrics"]} for r in records]
        err(f"confirming {confirm} plans here ({gpus} rank(s); 2 cells each, each cell runs "
            "full steps of the global batch: minutes) ...")
        cells = job.confirm(spec, rows, confirm, timeout, winner["spec"]["search"])
        for r in cells if path is not None else ():
            append_record(path, r)
        records += cells
    return build_report(records, top)


def _searched(**given) -> tuple[tuple[str, tuple], ...]:
    """The layout dimensions given, as (name, values) pairs: schedules in torch's spelling,
    async TP as booleans; SpecError for a value no layout takes."""
    from lmperf.core.vocabulary import as_list, on_off
    from lmperf.estimate.layout import schedule_name

    out = []
    for name, value in given.items():
        values = as_list(value)
        if not values:
            continue
        if name == "pp_schedule":
            values = [schedule_name(v) for v in values]
        elif name in ("async_tp", "compile"):
            values = [on_off(f"--{name.replace('_', '-')}", v) for v in values]
        elif name == "float8":
            from lmperf.estimate.candidate import FLOAT8
            from lmperf.validate import choice

            values = [choice("--float8 recipe", v, FLOAT8) for v in values]
        out.append((name, tuple(dict.fromkeys(values))))
    return tuple(out)


def _progress():
    """progress(done, total, what) of the search: a line on stderr every 2 s at most."""
    import time

    last = [time.monotonic()]

    def tell(done: int, total: int, what: str) -> None:
        if time.monotonic() - last[0] >= 2.0:
            last[0] = time.monotonic()
            err(f"  searched {done}/{total}: {what}")
    return tell


def _local_gpu() -> str:
    """The peak table's name of the GPU at hand; SpecError when there is none to name."""
    import torch

    from lmperf.runtime import device as dev
    from lmperf.runtime.peaks import spec_for_device_name

    found = dev.cuda_available() and spec_for_device_name(dev.device_name(torch.device("cuda")))
    if not found:
        raise SpecError("name the target: --gpu NAME (e.g. H100-SXM) for GPUs you do not have, "
                        "or --device cpu --gib G for this CPU's ranks")
    return found.name
