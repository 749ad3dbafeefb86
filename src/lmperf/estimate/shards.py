"""Per-rank memory of every parallel strategy from one simulated training step.

`lmperf memory`'s simulator (lmperf.estimate.simulate) runs one step of the model on
tensors that allocate nothing and records, event by event, the live bytes of each category
(parameters, gradients, optimizer state, activations, autocast copies, temporaries, inputs &
buffers). A strategy keeps a fraction of some categories on each of its N ranks; weighting the
timeline by those fractions and taking its maximum gives the rank's peak, which may fall at
another moment than the whole step's (sharding the optimizer state moves the peak from the
optimizer step into backward):

    ddp              everything whole
    zero1            optimizer state / N, and the optimizer step's temporaries / N (each rank
                     updates only its shard)
    zero2            and gradients / N
    fsdp             and parameters / N, plus the unit being gathered: its fp32 parameters and
                     unsharded gradients, 2 x 4 bytes x the largest unit (a block, or the
                     embedding / lm_head, V x C)
    tp               parameters, gradients, optimizer state (and the step's temporaries) x P_t / P;
                     activations and other temporaries x saved_activation_bytes(t) / (t = 1),
                     autocast copies / t (formulas.py: Megatron's splits)
    fsdp+tp          tp's fractions, states further / d, plus the gathered unit / t
What none of them shards stays whole: the inputs, and (data parallelism) activations and
autocast's bf16 weight copies, which are saved for backward (with FSDP over fp32 weights, copies
of the gathered parameters). The tp fractions scale the whole step's timeline, an approximation:
a real tensor-parallel step's events differ in order and size. Communication buffers (DDP's
gradient buckets, NCCL's) are not simulated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lmperf.estimate.formulas import Shape, saved_activation_bytes, tp_params

DATA_PARALLEL_SHARDS: dict[str, tuple[str, ...]] = {
    "ddp": (),
    "zero1": ("optimizer state",),
    "zero1-ar-bcast": ("optimizer state",),
    "zero2": ("optimizer state", "gradients"),
    "fsdp": ("optimizer state", "gradients", "parameters"),
}
_STATES = ("parameters", "gradients", "optimizer state")


@dataclass(frozen=True)
class RankMemory:
    """A rank's simulated peak, in bytes: model states and the rest at that moment."""

    states: float
    other: float
    allowance: float

    @property
    def total(self) -> float:
        """Peak live bytes plus what the simulation cannot see (the allowance)."""
        return self.states + self.other + self.allowance


def simulate(size: str, course: str, context: int, batch: int):
    """One simulated train step of the preset: bf16 autocast over fp32 weights (the 16 bytes
    per parameter of the model states), fused AdamW, sdpa attention, CUDA's allocator rounding.
    Returns the simulator's SimResult."""
    from lmperf.estimate.simulate import simulate_step
    from lmperf.workload.spec import RunSpec

    spec = RunSpec.from_size(size, course, context=context, batch=batch,
                             precision="bf16-mixed", mode="train-step", attention="sdpa",
                             optimizer="fused", device="cuda")
    return simulate_step(spec)


def keep_fractions(strategy: str, shape: Shape, n: int, t: int,
                   tokens: int) -> tuple[dict[str, float], float, float]:
    """What a rank keeps of the whole step, for `strategy` over `n` ranks (t-way tensor
    parallel for tp and fsdp+tp) and micro-batches of `tokens` tokens: (category -> fraction,
    fraction of the optimizer step's temporaries, extra bytes the timeline does not show)."""
    unit = max(4 * shape.d_model ** 2 + 3 * shape.d_model * shape.d_ff + 2 * shape.d_model,
               shape.vocab_size * shape.d_model)  # the largest FSDP unit, in parameters
    if strategy in DATA_PARALLEL_SHARDS:
        sharded = DATA_PARALLEL_SHARDS[strategy]
        extra = 2 * 4 * unit if strategy == "fsdp" else 0.0
        return {c: 1 / n for c in sharded}, (1 / n if sharded else 1.0), extra
    # Megatron: the split weights' states, copies and the activations inside attention and the
    # MLP shrink by t (formulas.tp_params, saved_activation_bytes); fsdp+tp shards the rest by d
    d = n // t
    states = tp_params(shape, t) / shape.params / (d if strategy == "fsdp+tp" else 1)
    saved = saved_activation_bytes(shape, tokens, t) / saved_activation_bytes(shape, tokens, 1)
    keep = {"parameters": states, "gradients": states, "optimizer state": states,
            "activations": saved, "temporaries": saved, "autocast copies": 1 / t}
    return keep, states, (2 * 4 * unit / t if strategy == "fsdp+tp" else 0.0)


def rank_memory(result, keep: dict[str, float], optimizer_temporaries: float = 1.0,
                extra: float = 0.0) -> RankMemory:
    """A rank's peak from a SimResult of the whole step: each category's bytes times the fraction
    `keep` gives it (1 if absent), the optimizer step's temporaries times
    `optimizer_temporaries` instead (the step works on the rank's shard), the peak taken over
    the weighted timeline, plus `extra` bytes it does not show (FSDP's gathered unit)."""
    from lmperf.estimate.simulate import CATEGORIES

    timeline = result.timeline
    optimizer_phase = (timeline["phase"] == "optimizer").to_numpy()
    columns = {}
    for c in CATEGORIES:
        weight = keep.get(c, 1.0)
        if c == "temporaries":
            weight = np.where(optimizer_phase, optimizer_temporaries, weight)
        columns[c] = timeline[c].to_numpy(dtype=float) * weight
    total = sum(columns.values())
    at = int(np.argmax(total))
    states = sum(columns[c][at] for c in _STATES)
    other = total[at] - states + extra
    return RankMemory(float(states), float(other), allowance_bytes(states + other))


def allowance_bytes(peak: float) -> float:
    """The simulator's CUDA allowance for a rank whose tensors peak at `peak` bytes: the CUDA
    context, cuBLAS workspaces and a fragmentation share (its ALLOWANCE_NOTE gives the basis)."""
    from lmperf.estimate.simulate import (CUBLAS_WORKSPACE_BYTES, CUDA_CONTEXT_BYTES,
                                                  FRAGMENTATION)

    return CUDA_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES + FRAGMENTATION * peak


def simulated_memory(size: str, course: str, context: int, batch: int, shape: Shape):
    """(rank_memory(strategy, N, t) -> (states, other bytes), allowance(bytes) -> bytes, note)
    from one simulated step of the preset, for lmperf.questions.parallel.estimate.estimate_rows;
    (None, None, why) when the simulator is missing or cannot run the model, so the estimate
    falls back to its analytic sums and says so."""
    from lmperf.errors import LmperfError

    try:
        result = simulate(size, course, context, batch)
    except ImportError:
        return None, None, "memory analytic: the step simulator is not installed"
    except LmperfError as exc:
        return None, None, f"memory analytic: {exc}"

    def per_rank(strategy: str, n: int, t: int) -> tuple[float, float]:
        held = rank_memory(result, *keep_fractions(strategy, shape, n, t, batch * context))
        return held.states, held.other

    note = (f"memory simulated ({result.seconds:.1f} s: one bf16-autocast train step with fused "
            f"AdamW and sdpa, each category scaled to a rank's share) + CUDA allowance")
    return per_rank, allowance_bytes, note
