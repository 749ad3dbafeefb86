"""Does it fit? A rank's simulated peak for any micro-batch, strategy and accumulation, and THE
verdict (`fits`). How the two simulations are read off for every micro-batch and what each
strategy keeps: docs/commands/plan.md, "How each number is made"."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from lmperf.estimate.formulas import Shape, saved_activation_bytes, tp_params
from lmperf.estimate.strategies import STATES, strategy as strategy_of

# plan precision -> the regime simulated
PRECISIONS: dict[str, str] = {"fp32": "fp32", "bf16-mixed": "bf16-mixed", "bf16-fsdp": "bf16-true"}
_CATEGORIES = ("parameters", "gradients", "optimizer state", "activations", "autocast copies",
               "temporaries", "inputs & buffers")


def fits(need: float, budget: float | None) -> bool | None:
    """THE answer to "does it fit": `need` bytes (a peak with its allowance) within `budget`
    bytes (None: no budget, no verdict)."""
    return None if budget is None else bool(need <= budget)


def keep_fractions(strategy: str, shape: Shape, n: int, t: int,
                   tokens: int) -> tuple[dict[str, float], float, float]:
    """What a rank keeps of the whole step, for `strategy` over `n` ranks (t-way tensor
    parallel) and micro-batches of `tokens` tokens: (category -> fraction, fraction of the
    optimizer step's temporaries, extra bytes the timeline does not show: FSDP's gathered
    unit, fp32 parameters and gradients of the largest block or V x C)."""
    s, d = strategy_of(strategy), n // t
    unit = max(4 * shape.d_model ** 2 + 3 * shape.d_model * shape.d_ff + 2 * shape.d_model,
               shape.vocab_size * shape.d_model)  # the largest FSDP unit, in parameters
    extra = 2 * 4 * unit / t if s.gathers else 0.0
    if t == 1:
        return {c: 1 / d for c in s.shards}, (1 / d if s.shards else 1.0), extra
    # Megatron: the split weights' states, copies and the activations inside attention and the
    # MLP shrink by t (formulas.tp_params, saved_activation_bytes); fsdp+tp shards the rest by d
    states = tp_params(shape, t) / shape.params / (d if s.shards else 1)
    saved = saved_activation_bytes(shape, tokens, t) / saved_activation_bytes(shape, tokens, 1)
    keep = {"parameters": states, "gradients": states, "optimizer state": states,
            "activations": saved, "temporaries": saved, "autocast copies": 1 / t}
    return keep, states, extra


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
    from lmperf.estimate.simulate import allowance_bytes

    keep, opt_temps, extra = keep_fractions(strategy, shape, n, t, batch * context)
    unit = extra * t / 8  # parameters of the largest unit FSDP gathers (0 for the others)
    scale = 1.0
    if precision == "bf16-fsdp":  # bf16 states simulated, fp32 shards held: x 2
        scale = 2.0
        extra = (2 * 2 * unit + 2 * unit) / t  # two units' bf16 weights, one unit's bf16 gradients
    if readable and strategy == "zero1":  # whole tensors to owners: the largest owner's share
        keep = {"optimizer state": shape.owner_share(n)}
        opt_temps = shape.owner_share(n)
    if readable and unit:  # weights gathered in the compute dtype, never autocast's copies
        extra = 0.0
        keep = {**keep, "autocast copies": 0.0}
    live = lines.base + (batch - 1) * lines.slope  # (events, categories)
    weights = np.array([keep.get(c, 1.0) * (scale if c in STATES else 1.0) for c in _CATEGORIES])
    weighted = live * weights
    temps = _CATEGORIES.index("temporaries")
    weighted[lines.optimizer, temps] = live[lines.optimizer, temps] * opt_temps
    g = _CATEGORIES.index("gradients")
    if accum > 1:  # earlier micro-batches' gradients stay through forward and backward
        full = weighted[:, g].max()
        weighted[lines.training, g] = np.maximum(weighted[lines.training, g], full)
    total = weighted.sum(axis=1)
    peak = float(total.max()) + extra
    if strategy_of(strategy).buckets and readable and n > 1:
        # the flat copy of the gradients, made once backward is over: only states are left then
        end = int(np.argmax(lines.optimizer)) - 1
        held = [_CATEGORIES.index(c) for c in (*STATES, "inputs & buffers")]
        peak = max(peak, float(weighted[end, held].sum() + weighted[end, g]))
    elif strategy_of(strategy).buckets and n > 1:  # torch DDP's buckets, always there
        peak += float(weighted[:, g].max())
    return peak, allowance_bytes(peak, device)


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
            "fits": fits(total, budget_gib)}
