"""From a request (`lmperf memory`'s keywords) to checked jobs, before anything runs.

Everything that can be wrong with the input is found here, so that a bad request ends with one
line before the first child starts: unknown names, non-positive numbers, a context longer than
the model allows, checkpoint group sizes larger than the model, a user model that cannot be
built, or analyses a user model cannot have (checkpointing knows the reference LM only; the
simulated estimate runs any model), or an attention kernel the simulation cannot run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from lmperf.core.vocabulary import (MODEL_SIZE, as_list, checkpoint_order, checkpoint_policy,
                                   device_defaults, resolve_threads)
from lmperf.errors import SpecError
from lmperf.questions.memory.spec import MemorySpec
from lmperf.validate import non_negative_int, positive_int
from lmperf.workload.spec import RunSpec

DEFAULT_MODES: tuple[str, ...] = ("forward", "train-step")


@dataclass
class MemoryPlan:
    """The checked request: the base run (longest context, first precision), the axes, and
    the jobs (empty for the estimate, which allocates nothing and runs in the caller)."""

    base: RunSpec
    contexts: list[int]
    precisions: list[str]
    modes: list[str]
    jobs: list[MemorySpec] = field(default_factory=list)
    # --estimate's checkpoint policies (canonical: lmperf.validate.checkpoint_policy)
    groups: list[str | int] = field(default_factory=lambda: ["none"])


def _device(name: str, estimate: bool) -> torch.device:
    from lmperf.runtime.device import resolve_device

    if estimate and name == "cuda":
        return torch.device("cuda")  # an estimate for a GPU needs no GPU here
    return resolve_device(name)


def plan_memory(*, size: str | None, model: str | None, context: Sequence[int] | int | None,
                batch: int, precision: Sequence[str] | str | None, mode: Sequence[str] | str,
                attention: str | None, optimizer: str, warmup: int, steps: int, seed: int, device: str,
                threads: int | None, model_context: int, estimate: bool, gib: float | None,
                checkpoint: Sequence[str | int] | str | int | None, top: int, course: str,
                float8: str = "none", vocab_size: int | None = None) -> MemoryPlan:
    """Check the request and build its jobs (keywords as `lmperf.memory`'s, whose defaults are
    the only ones).

    Values left None take the device's defaults (core.vocabulary.DEFAULTS["memory"]; attention:
    naive, `lmperf.memory` gives sdpa for --gpu); with
    `model` and no `size`, core.vocabulary.MODEL_SIZE's shape, as in every command. Raises
    SpecError, or ModelLoadError for a user model that cannot be built or has the wrong shape.
    """
    from lmperf.workload.build import check_user_models, resolve_optimizer

    estimate = estimate or gib is not None  # --gib asks a question only the estimate answers
    attention = attention or "naive"
    dev_ = _device(device, estimate)
    defaults = device_defaults("memory", dev_.type, course)
    contexts = as_list(context) or list(defaults["context"])
    for t in contexts:
        positive_int("--context", t)
    non_negative_int("--warmup", warmup)
    positive_int("--steps", steps)
    positive_int("--top", top)
    if gib is not None and not gib > 0:
        raise SpecError(f"--gib must be positive, got {gib:g}")
    contexts = sorted(dict.fromkeys(contexts))
    precisions = list(dict.fromkeys(as_list(precision) or defaults["precision"]))
    modes = list(dict.fromkeys(as_list(mode) or []))
    if not modes:
        raise SpecError("--mode needs at least one of: forward, forward-backward, train-step")
    if model and checkpoint is not None:
        raise SpecError("--checkpoint knows the reference LM only, not --model")
    if estimate and float8 != "none":
        raise SpecError("--estimate --float8: torchao's float8 tensors do not run on the "
                        "simulation's phantom tensors; measure it (without --estimate)")
    if estimate:
        from lmperf.questions.memory.estimate_sim import check_attention

        check_attention(attention)
        if warmup == 0 and "train-step" in modes:
            raise SpecError("--estimate simulates the step after the warm-up (AdamW state "
                            "allocated); --warmup 0 is measured, not simulated")
    base = RunSpec.from_size(
        size or (MODEL_SIZE if model else defaults["size"]), course, context=contexts[-1],
        model_context=model_context, batch=batch, precision=precisions[0],
        mode="train-step", attention=attention,
        optimizer=resolve_optimizer(optimizer, dev_),
        warmup=warmup, steps=steps, seed=seed, device=dev_.type, model=model,
        threads=resolve_threads(threads, dev_.type), float8=float8,
        **({} if vocab_size is None else {"vocab_size": vocab_size}))
    for value in precisions[1:]:
        base.with_(precision=value)  # checks the name
    for value in modes:
        base.with_(mode=value)
    plan = MemoryPlan(base, contexts, precisions, modes)
    if float8 != "none":
        from lmperf.runtime.precision import require_float8

        require_float8({float8}, dev_)
    if model:
        check_user_models([base])
    if checkpoint is not None:
        from lmperf.questions.memory.checkpointing import check_groups

        groups = check_groups(as_list(checkpoint), base.num_layers)
    if estimate:
        if checkpoint is not None:
            from lmperf.estimate.checkpoint_plan import sqrt_rule

            # The sqrt(N) rule's group joins the sweep: the course asks what it costs.
            plan.groups = ["none", *sorted({*groups[1:], checkpoint_policy(
                sqrt_rule(base.num_layers))}, key=checkpoint_order)]
        return plan
    if checkpoint is not None:
        plan.jobs = [MemorySpec.from_run(base.with_(precision=p, context=t),
                                         analysis="checkpoint", contexts=(t,),
                                         groups=tuple(groups), top=top)
                     for p in precisions for t in contexts]
        return plan
    plan.jobs = [MemorySpec.from_run(base.with_(precision=p), analysis=analysis,
                                     contexts=tuple(contexts), modes=tuple(modes), top=top)
                 for analysis in ("phases", "saved") for p in precisions]
    return plan


def estimate_records(plan: MemoryPlan, gib: float | None,
                     results: dict | None = None) -> list[dict]:
    """One simulated step per (mode, precision, context, checkpoint policy) as 'estimate'
    records (allocates nothing).
    `results`, if given, receives each case's SimResult (for the timeline plots)."""
    from lmperf.questions.memory.estimate_sim import analytic, cases, metrics, run_case, what_fits
    from lmperf.questions.memory.job import make_records

    base = plan.base
    cache: dict = {}
    items, params = [], None
    for case in cases(plan.modes, plan.precisions, plan.contexts, plan.groups):
        res = run_case(base, case, cache)
        if results is not None:
            results[case] = res
        est = analytic(base, case)
        params = params or (est.params if est else None)
        items.append(({"context": case.context, "precision": case.precision,
                       "mode": case.mode, "checkpoint_group": case.group}, "ok",
                      metrics(res, est, gib)))
    misfits = [i for i, (_, _, m) in enumerate(items) if m["fits"] is False]
    if misfits:  # the largest: what would make it fit, simulated (what fits it fits the rest)
        c, _, m = items[max(misfits, key=lambda i: items[i][2]["simulation"]["total_bytes"])]
        m["what_fits"] = what_fits(base.with_(mode=c["mode"], precision=c["precision"],
                                              context=c["context"]), c["checkpoint_group"], gib)
    return make_records(base, "estimate", items, params)
