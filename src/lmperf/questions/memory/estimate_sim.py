"""`lmperf memory --estimate`: one simulated step per (mode, precision, context, checkpointing),
as records, with the analytic terms beside it as the explanation.

The figure reported is the simulation's (simulate.py), plus for CUDA the stated allowance; the
analytic terms (estimate.py) are put in the simulator's categories beside what is alive at the
simulated peak, so the two never give two totals (docs/commands/memory.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lmperf.errors import SpecError
from lmperf.questions.memory.estimate import MemoryEstimate, estimate
from lmperf.units import GIB, MIB
from lmperf.validate import checkpoint_policy
from lmperf.estimate.simulate import CATEGORIES, SimResult, simulate_step
from lmperf.workload.spec import RunSpec

METHOD = ("simulated: lmperf's train step run on phantom tensors (meta storage, nothing "
          "allocated), live tensor bytes tracked op by op; checked against torch's MemTracker on "
          "real tensors (docs/accuracy.md)")
# Attention kernels the simulation cannot run as they would run for real: refused in one line.
UNSIMULATED = {
    "compiled": "torch.compile's fused kernels cannot run on phantom tensors (they would run "
                "eagerly, which is the naive kernel's memory)",
    "flash-triton": "a Triton kernel cannot run on phantom tensors",
}


@dataclass(frozen=True)
class Case:
    """One simulated step: mode, precision, context, checkpoint policy."""

    mode: str
    precision: str
    context: int
    group: str | int = "none"  # the policy (lmperf.validate.checkpoint_policy's canonical)


def cases(modes: list[str], precisions: list[str], contexts: list[int],
          groups: list[str | int]) -> list[Case]:
    """Every (mode, precision, context, group), in that order."""
    return [Case(m, p, t, g) for m in modes for p in precisions for t in contexts for g in groups]


def check_attention(attention: str) -> None:
    """SpecError (one line) for an attention kernel the simulation cannot run."""
    if attention in UNSIMULATED:
        raise SpecError(f"--estimate --attention {attention}: {UNSIMULATED[attention]}; "
                        "estimate with naive, sdpa or flash-torch")


def run_case(base: RunSpec, case: Case, cache: dict[tuple, SimResult]) -> SimResult:
    """Simulate one case. A forward step builds no autograd graph, so checkpointing changes
    nothing in it: its rows share one simulation (kept in `cache`)."""
    spec = base.with_(mode=case.mode, precision=case.precision, context=case.context)
    key = (case.mode, case.precision, case.context, case.mode == "forward" or case.group)
    if key not in cache:
        cache[key] = simulate_step(spec, case.group)
    return cache[key]


def analytic(base: RunSpec, case: Case) -> MemoryEstimate | None:
    """The analytic terms of a case (the reference LM only; None for a user's model)."""
    if base.model is not None or case.group == "op":
        return None
    return estimate(base.model_config(), base.batch, case.context, case.precision,
                    base.attention, case.mode, case.group, device=base.device)


def analytic_by_category(est: MemoryEstimate) -> dict[str, int]:
    """The analytic terms in the simulator's categories (bytes)."""
    return {"parameters": est.param_bytes, "gradients": est.grad_bytes,
            "optimizer state": est.optimizer_bytes,
            "activations": est.activation_bytes + est.recompute_bytes,
            "autocast copies": est.weight_copy_bytes, "temporaries": est.transient_bytes,
            "inputs & buffers": 0}


def metrics(res: SimResult, est: MemoryEstimate | None, gib: float | None) -> dict:
    """An 'estimate' record's metrics: the simulation, the analytic terms, the budget verdict."""
    sim = {"peak_bytes": res.peak_bytes, "start_bytes": res.start_bytes,
           "peak_phase": res.peak_phase, "phase_peaks": res.phase_peaks,
           "composition": res.composition, "allowance_bytes": res.allowance_bytes,
           "total_bytes": res.total_bytes, "ops": res.ops, "seconds": res.seconds,
           "recomputed_blocks": res.recomputed_blocks,
           "notes": res.notes, "method": METHOD}
    from lmperf.estimate.fit import fits

    out: dict = {"simulation": sim, "gib": gib,
                 "fits": fits(res.total_bytes, None if gib is None else gib * GIB)}
    if est is not None:
        out["estimate"] = {**est.__dict__, "total_bytes": est.total_bytes}
    return out


def reconcile_rows(sim: dict, est: dict | None) -> list[dict]:
    """Category rows: the analytic terms (all counted at once) beside what is alive at the
    simulated peak (MiB), then the totals and the estimate (peak + allowance)."""
    ana = analytic_by_category(MemoryEstimate(**{k: v for k, v in est.items()
                                                 if k in MemoryEstimate.__dataclass_fields__})
                               ) if est else {}
    rows = [{"category": c, "analytic terms MiB": ana[c] / MIB if ana else None,
             "alive at the simulated peak MiB": sim["composition"][c] / MIB}
            for c in CATEGORIES]
    rows.append({"category": "sum of terms / simulated peak",
                 "analytic terms MiB": sum(ana.values()) / MIB if ana else None,
                 "alive at the simulated peak MiB": sim["peak_bytes"] / MIB})
    if sim["allowance_bytes"]:
        rows.append({"category": "allowance (CUDA context, workspaces, fragmentation)",
                     "analytic terms MiB": None,
                     "alive at the simulated peak MiB": sim["allowance_bytes"] / MIB})
        rows.append({"category": "estimate (simulated peak + allowance)",
                     "analytic terms MiB": None,
                     "alive at the simulated peak MiB": sim["total_bytes"] / MIB})
    return rows


def what_fits(spec: RunSpec, group: str | int, gib: float) -> list[dict]:
    """What would make one step of `spec` (checkpoint policy `group`) fit in `gib`
    GiB, each a simulated step as `fits` decides: sdpa for naive attention, the sqrt(N) rule's
    checkpointing, the largest smaller batch (halving); else the three together; else, beside
    them, about how many GPUs sharding the training states (FSDP) alone would need (`gpus`;
    None: not even that), for lmperf plan to search. [{'flags': '--batch 1', 'gib': 64.2}]."""
    from lmperf.estimate.checkpoint_plan import sqrt_rule
    from lmperf.estimate.fit import device_fit

    def need(s: RunSpec, g: int) -> float:
        return device_fit(s, None, g).get("peak_gib", math.inf)

    lighter = spec.with_(attention="sdpa") if spec.attention == "naive" else spec
    every = (checkpoint_policy(sqrt_rule(spec.num_layers)) if spec.mode != "forward"
             and group == "none" else group)
    tries = [("--attention sdpa", lighter, group)] if lighter is not spec else []
    tries += [(f"--checkpoint {every}", spec, every)] if every != group else []
    out = [{"flags": f, "gib": g} for f, s, k in tries if (g := need(s, k)) <= gib]
    batch = spec.batch // 2
    while batch >= 1 and not any(o["flags"].startswith("--batch") for o in out):
        if (g := need(spec.with_(batch=batch), group)) <= gib:
            out.append({"flags": f"--batch {batch}", "gib": g})
        batch //= 2
    if out:
        return out
    least = lighter.with_(batch=1)
    flags = " ".join([f for f, _, _ in tries] + ["--batch 1"])
    res = simulate_step(least, every)
    if (g := res.total_bytes / GIB) <= gib:
        return [{"flags": flags, "gib": g}]
    # Sharded N ways (FSDP), the training states shrink by N and nothing else does: a floor
    states = sum(res.composition[c] for c in ("parameters", "gradients", "optimizer state"))
    room = gib * GIB - (res.total_bytes - states)
    return [{"flags": flags, "gib": g, "gpus": math.ceil(states / room) if room > 0 else None}]
