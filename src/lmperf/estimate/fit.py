"""Does it fit? A rank's simulated peak for any micro-batch, strategy and accumulation.

Two simulated steps (`estimate.simulate`), at micro-batch 1 and 2, have the same events (the
ops do not depend on the batch) and every tensor is fixed or proportional to the batch, so the
live bytes at event e for micro-batch b are exactly live_e(1) + (b - 1) (live_e(2) - live_e(1))
(up to CUDA's 512-byte rounding). A rank keeps a fraction of each category (`keep_fractions`:
ZeRO-1 the optimizer state and the optimizer step's temporaries / N, ZeRO-2 and the gradients,
FSDP and the parameters plus the largest unit it gathers; TP Megatron's splits of the states,
activations and autocast copies, scaling the whole timeline, an approximation), so its peak
for any b is one weighted maximum over the events, which may fall at another moment than the
step's. With accumulation the earlier micro-batches' gradients stay through forward and
backward. FSDP's mixed-precision policy ('bf16-fsdp': bf16 compute, fp32 sharded master
weights and reduction) is a bf16 step whose states are counted as fp32 shards.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from lmperf.estimate.formulas import Shape, saved_activation_bytes, tp_params

# plan precision -> the regime simulated
PRECISIONS: dict[str, str] = {"fp32": "fp32", "bf16-mixed": "bf16-mixed", "bf16-fsdp": "bf16-true"}
_STATES = ("parameters", "gradients", "optimizer state")
_CATEGORIES = ("parameters", "gradients", "optimizer state", "activations", "autocast copies",
               "temporaries", "inputs & buffers")


DATA_PARALLEL_SHARDS: dict[str, tuple[str, ...]] = {
    "ddp": (),
    "zero1": ("optimizer state",),
    "zero1-ar-bcast": ("optimizer state",),
    "zero2": ("optimizer state", "gradients"),
    "fsdp": ("optimizer state", "gradients", "parameters"),
}


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


def allowance_bytes(peak: float) -> float:
    """The simulator's CUDA allowance for a rank whose tensors peak at `peak` bytes: the CUDA
    context, cuBLAS workspaces and a fragmentation share (its ALLOWANCE_NOTE gives the basis)."""
    from lmperf.estimate.simulate import CUBLAS_WORKSPACE_BYTES, CUDA_CONTEXT_BYTES, FRAGMENTATION

    return CUDA_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES + FRAGMENTATION * peak


@dataclass(frozen=True)
class Workload:
    """What is simulated: the model (`size` or a factory `model`), context, attention, and the
    device whose allocator and autocast lists apply."""

    size: str | None
    course: str
    model: str | None
    context: int
    attention: str
    device: str  # 'cuda' or 'cpu'
    optimizer: str = "fused"

    def spec(self, batch: int, precision: str):
        from lmperf.workload.spec import RunSpec

        return RunSpec.from_size(self.size or "mini", self.course, model=self.model,
                                 context=self.context, batch=batch, precision=precision,
                                 mode="train-step", attention=self.attention,
                                 optimizer=self.optimizer, device=self.device)


@dataclass(frozen=True)
class Timelines:
    """Live bytes per category at every event for micro-batch 1 (`base`, events x categories)
    and what one more sequence adds (`slope`); `optimizer` marks the optimizer's events,
    `training` forward and backward's; `seconds` the two simulations' time."""

    base: np.ndarray
    slope: np.ndarray
    optimizer: np.ndarray
    training: np.ndarray
    seconds: float


@lru_cache(maxsize=64)
def timelines(work: Workload, precision: str, checkpoint: int) -> Timelines:
    """The affine timeline of `work` in plan precision `precision` with checkpoint groups of
    `checkpoint` blocks (0: none): two simulations, cached for the process."""
    from lmperf.estimate.simulate import simulate_step

    regime = PRECISIONS[precision]
    one, two = (simulate_step(work.spec(b, regime), checkpoint_group=checkpoint) for b in (1, 2))
    a, b = (r.timeline[list(_CATEGORIES)].to_numpy(dtype=float) for r in (one, two))
    if a.shape != b.shape:  # the ops changed with the batch: cannot interpolate
        from lmperf.errors import SpecError

        raise SpecError("cannot plan this model: its step runs other ops at micro-batch 1 and 2")
    phase = one.timeline["phase"].to_numpy()
    return Timelines(a, b - a, phase == "optimizer", np.isin(phase, ("forward", "backward")),
                     one.seconds + two.seconds)


def rank_peak(lines: Timelines, shape: Shape, strategy: str, n: int, t: int, batch: int,
              accum: int, precision: str, device: str, context: int,
              readable: bool = False) -> tuple[float, float]:
    """(peak live bytes of one rank, allowance: the CUDA context, workspaces and fragmentation,
    0 on a CPU) for micro-batch `batch`, `accum` micro-batches per step, `strategy` over `n`
    ranks (t-way tensor parallel for tp and fsdp+tp). Beyond the single-device step: torch DDP's
    gradient buckets (for its whole life), FSDP2's gathered and prefetched units; `readable`
    (lmperf's own strategies, which --confirm runs): the flat copy of the gradients once backward
    is over, ZeRO-1's whole tensors per owner, and the readable FSDP without autocast copies and
    without its gathered units, which its head's backward holds at a moment that is the peak only
    when a micro-batch's logits are smaller than them (docs/accuracy.md: -4.4% at micro-batch 1)."""
    keep, opt_temps, extra = keep_fractions(strategy, shape, n, t, batch * context)
    unit = extra / 8  # parameters of the largest unit FSDP gathers (0 for the others)
    scale = 1.0
    if precision == "bf16-fsdp":  # bf16 states simulated, fp32 shards held: x 2
        scale = 2.0
        extra = 2 * 2 * unit + 2 * unit  # two units' bf16 weights, one unit's bf16 gradients
    if readable and strategy == "zero1":  # whole tensors to owners: the largest owner's share
        keep = {"optimizer state": shape.owner_share(n)}
        opt_temps = shape.owner_share(n)
    if readable and unit:  # weights gathered in the compute dtype, never autocast's copies
        extra = 0.0
        keep = {**keep, "autocast copies": 0.0}
    live = lines.base + (batch - 1) * lines.slope  # (events, categories)
    weights = np.array([keep.get(c, 1.0) * (scale if c in _STATES else 1.0) for c in _CATEGORIES])
    weighted = live * weights
    temps = _CATEGORIES.index("temporaries")
    weighted[lines.optimizer, temps] = live[lines.optimizer, temps] * opt_temps
    g = _CATEGORIES.index("gradients")
    if accum > 1:  # earlier micro-batches' gradients stay through forward and backward
        full = weighted[:, g].max()
        weighted[lines.training, g] = np.maximum(weighted[lines.training, g], full)
    total = weighted.sum(axis=1)
    peak = float(total.max()) + extra
    if strategy in ("ddp", "zero1") and readable and n > 1:
        # the flat copy of the gradients, made once backward is over: only states are left then
        end = int(np.argmax(lines.optimizer)) - 1
        held = [_CATEGORIES.index(c) for c in (*_STATES, "inputs & buffers")]
        peak = max(peak, float(weighted[end, held].sum() + weighted[end, g]))
    elif strategy in ("ddp", "zero1") and n > 1:  # torch DDP's buckets, always there
        peak += float(weighted[:, g].max())
    return peak, (allowance_bytes(peak) if device == "cuda" else 0.0)


def device_fit(spec, budget_gib: float | None, checkpoint: int = 0) -> dict:
    """Does one step of `spec` (a RunSpec, single device) fit in `budget_gib`? Its simulated peak
    plus, on CUDA, the allowance, held against the budget: the same answer `memory --estimate`,
    `dist --estimate` at one device and `plan` give. {} when the model cannot be simulated."""
    from lmperf.errors import SpecError
    from lmperf.estimate.simulate import simulate_step

    try:
        res = simulate_step(spec, checkpoint_group=checkpoint)
    except SpecError:
        return {}
    total = res.total_bytes / 2**30  # peak + allowance, as memory --estimate's "fits"
    return {"peak_gib": total, "simulated_gib": res.peak_bytes / 2**30, "budget_gib": budget_gib,
            "fits": None if budget_gib is None else total <= budget_gib}


def simulated_memory(size: str, course: str, context: int, batch: int, shape: Shape):
    """(per_rank(strategy, N, t) -> (model states, the rest at the peak), allowance(bytes),
    note) for `dist --estimate`: `rank_peak` of a bf16-autocast step with fused AdamW and sdpa
    on CUDA, states as the formulas count them; (None, None, why) when the simulator cannot
    run the model, so the estimate falls back to its analytic sums and says so."""
    from lmperf.errors import LmperfError

    work = Workload(size, course, None, context, "sdpa", "cuda")
    try:
        lines = timelines(work, "bf16-mixed", 0)
    except ImportError:
        return None, None, "memory analytic: the step simulator is not installed"
    except LmperfError as exc:
        return None, None, f"memory analytic: {exc}"

    def per_rank(strategy: str, n: int, t: int) -> tuple[float, float]:
        peak, _ = rank_peak(lines, shape, strategy, n, t, batch, 1, "bf16-mixed", "cuda", context)
        keep, _, _ = keep_fractions(strategy, shape, n, t, batch * context)
        # fp32 weights 4, gradients 4, AdamW's moments 8 bytes per parameter, each its share
        states = shape.params * (4 * keep.get("parameters", 1.0) + 4 * keep.get("gradients", 1.0)
                                 + 8 * keep.get("optimizer state", 1.0))
        return states, peak - states

    note = (f"memory simulated ({lines.seconds:.1f} s: two bf16-autocast train steps with fused "
            "AdamW and sdpa, each category scaled to a rank's share, as `lmperf plan` does) + "
            "CUDA allowance")
    return per_rank, allowance_bytes, note
