"""Does it fit? A rank's simulated peak for any micro-batch, strategy and accumulation, and THE
verdict (`fits`). How the two simulations are read off for every micro-batch and what each
strategy keeps: docs/commands/plan.md, "How each number is made"."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from lmperf.estimate.candidate import Candidate
from lmperf.estimate.formulas import Shape, tp_params
from lmperf.estimate.strategies import STATES, strategy as strategy_of

# plan precision -> the regime simulated
PRECISIONS: dict[str, str] = {"fp32": "fp32", "bf16-mixed": "bf16-mixed", "bf16-fsdp": "bf16-true"}
_CATEGORIES = ("parameters", "gradients", "optimizer state", "activations", "autocast copies",
               "temporaries", "inputs & buffers")
_HEAD = ("head activations", "head temporaries")  # simulate.HEAD: the output's part of two


def fits(need: float, budget: float | None) -> bool | None:
    """THE answer to "does it fit": `need` bytes (a peak with its allowance) within `budget`
    bytes (None: no budget, no verdict)."""
    return None if budget is None else bool(need <= budget)


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
    """Live bytes per category at every event for micro-batch 1 (`base`, events x categories
    and the output's part of the activations and temporaries, _CATEGORIES + _HEAD) and what one
    more sequence adds (`slope`); `optimizer` marks the optimizer's events, `training` forward
    and backward's; `seconds` the two simulations' time."""

    base: np.ndarray
    slope: np.ndarray
    optimizer: np.ndarray
    training: np.ndarray
    seconds: float
    backward: np.ndarray | None = None  # backward's events (None: a timeline made by hand)


@lru_cache(maxsize=64)
def timelines(work: Workload, precision: str, checkpoint: int) -> Timelines:
    """The affine timeline of `work` in plan precision `precision` with checkpoint groups of
    `checkpoint` blocks (0: none): two simulations, cached for the process."""
    from lmperf.estimate.simulate import simulate_step

    regime = PRECISIONS[precision]
    one, two = (simulate_step(work.spec(b, regime), checkpoint_group=checkpoint) for b in (1, 2))
    a, b = (r.timeline[list(_CATEGORIES + _HEAD)].to_numpy(dtype=float) for r in (one, two))
    if a.shape != b.shape:  # the ops changed with the batch: cannot interpolate
        from lmperf.errors import SpecError

        raise SpecError("cannot plan this model: its step runs other ops at micro-batch 1 and 2")
    phase = one.timeline["phase"].to_numpy()
    return Timelines(a, b - a, phase == "optimizer", np.isin(phase, ("forward", "backward")),
                     one.seconds + two.seconds, phase == "backward")


def block_params(shape: Shape) -> float:
    """Parameters of one block of the reference LM: q and o C^2 each, k and v C Hkv D each,
    the SwiGLU's three C F, two RMSNorm weights C (a user's model: its average block)."""
    C, F = shape.d_model, shape.d_ff
    kv = C * shape.num_kv_heads // shape.num_heads if shape.num_kv_heads else C  # Hkv D
    block = 2 * C * C + 2 * C * kv + 3 * C * F + 2 * C
    return block if block * shape.num_layers < shape.params else shape.params / shape.num_layers


@dataclass(frozen=True)
class RankShare:
    """What one rank of a layout holds of the whole step: `states` of the parameters (its
    stages' share, its 1/t of the split weights), `layers` blocks' activations of one
    micro-batch held at once (in-flight chunks x their blocks; the step's L without a
    pipeline), whether it runs the output (`head`), `params` its stages' parameters, `blocks`
    the blocks it runs."""

    states: float
    layers: float
    head: bool
    params: float
    blocks: int


def rank_shares(shape: Shape, c: Candidate, global_batch: int | None = None) -> list[RankShare]:
    """The distinct ranks of candidate `c`'s layout (one without a pipeline; one per pipeline
    rank that differs in blocks, in-flight micro-batches or the output). A pipeline rank's
    stages hold their blocks' parameters and, the first the embedding, the last the output
    (V C + C); what it holds in flight is its schedule's (`Layout.in_flight`) for the step's
    micro-batches (the rank's batch / b; `global_batch` None: as many as the pipeline needs)."""
    lay, L = c.layout, shape.num_layers
    tp = tp_params(shape, lay.tp) / shape.params if lay.tp > 1 else 1.0
    if lay.pp == 1:
        return [RankShare(tp, L, True, shape.params, L)]
    block = block_params(shape)
    outside = max(shape.params - L * block, 0.0)
    embed = min(shape.vocab_size * shape.d_model, outside / 2) if shape.vocab_size else outside / 2
    stages = lay.split(L)
    m = (lay.local_batch(global_batch) // c.micro_batch if global_batch
         else lay.pp * lay.pp_virtual)
    found: dict[tuple, RankShare] = {}
    for r in range(lay.pp):
        mine = [stages[i] for i in lay.rank_stages(r)]
        blocks = sum(s.layers for s in mine)
        params = (blocks * block + embed * any(s.embedding for s in mine)
                  + (outside - embed) * any(s.head for s in mine))
        held = lay.in_flight(r, m) * blocks / len(mine)  # chunks in flight x blocks per chunk
        share = RankShare(params / shape.params * tp, held, any(s.head for s in mine), params,
                          blocks)
        found.setdefault((share.states, share.layers, share.head), share)
    return list(found.values())


def rank_peak(lines: Timelines, shape: Shape, c: Candidate, context: int, device: str,
              readable: bool = False, global_batch: int | None = None) -> tuple[float, float]:
    """(peak live bytes of the fullest rank, allowance: the CUDA context, workspaces and
    fragmentation, 0 on a CPU) of candidate `c` at `context` tokens: the simulated step of one
    micro-batch re-weighted by what a rank keeps of each category (`rank_shares`, the
    strategy's shards, 1 / (t cp) of the activations and temporaries: sequence, loss and context
    parallelism split every token-sized tensor), the maximum taken again. Beyond the
    single-device step: torch DDP's gradient buckets (for its whole life), FSDP2's gathered and
    prefetched units, or under a pipeline its stages' whole weights and fp32 gradients (FSDP2
    under PP reshards neither after forward nor until the last micro-batch: torchtitan), torch's
    sequence parallelism's gathered matmul inputs kept whole for backward (2 (b T C) per block
    not checkpointed); `readable` (lmperf's own strategies, which --confirm runs): the flat copy
    of the gradients once backward is over, ZeRO-1's whole tensors per owner, and the readable
    FSDP without autocast copies and without its gathered units, which its head's backward
    holds at a moment that is the peak only when a micro-batch's logits are smaller than them
    (docs/accuracy.md: -4.4% at micro-batch 1)."""
    from lmperf.estimate.simulate import allowance_bytes

    peak = max(_rank_peak(lines, shape, c, share, context, readable)
               for share in rank_shares(shape, c, global_batch))
    return peak, allowance_bytes(peak, device)


def _rank_peak(lines: Timelines, shape: Shape, c: Candidate, share: RankShare, context: int,
               readable: bool) -> float:
    """One rank's peak (see `rank_peak`)."""
    lay, b, strategy = c.layout, c.micro_batch, strategy_of(c.strategy)
    t, L, S = lay.tp, shape.num_layers, c.shard_degree
    tokens = 1 / (t * lay.cp)  # each token-sized tensor's share
    unit = max(4 * shape.d_model ** 2 + 3 * shape.d_model * shape.d_ff + 2 * shape.d_model,
               shape.vocab_size * shape.d_model)  # the largest FSDP unit, in parameters
    keep = {cat: share.states / (S if cat in strategy.shards else 1) for cat in STATES}
    opt_temps = share.states / (S if strategy.shards else 1)
    keep["autocast copies"] = share.layers / L / t  # saved per forward of a micro-batch
    scale, extra = 1.0, 0.0
    if strategy.gathers:  # two units gathered in fp32 (prefetch)
        extra = 2 * 4 * unit / t
    if c.precision == "bf16-fsdp":  # bf16 states simulated, fp32 shards held: x 2
        scale = 2.0
        extra = (2 * 2 * unit + 2 * unit) / t  # two units' bf16 weights, one unit's bf16 gradients
    if strategy.gathers and lay.pp > 1:  # the stages' weights and fp32 gradients, whole
        extra = share.params / t * ((2 if c.precision != "fp32" else 4) + 4)
    if readable and c.strategy == "zero1":  # whole tensors to owners: the largest owner's share
        keep["optimizer state"] = opt_temps = shape.owner_share(lay.dp)
    if readable and strategy.gathers:  # weights gathered in the compute dtype, never copies
        extra = 0.0
        keep["autocast copies"] = 0.0
    live = lines.base + (b - 1) * lines.slope  # (events, categories + head's two)
    cats = len(_CATEGORIES)
    head_act, head_tmp = live[:, cats], live[:, cats + 1]
    weights = np.array([keep.get(cat, 1.0) * (scale if cat in STATES else 1.0)
                        for cat in _CATEGORIES])
    weighted = live[:, :cats] * weights
    act, tmp = _CATEGORIES.index("activations"), _CATEGORIES.index("temporaries")
    # the blocks' activations held (share.layers of L) and the output's where the rank has it
    body = live[:, act] - head_act
    weighted[:, act] = tokens * (body * share.layers / L + head_act * share.head)
    if t > 1:  # SequenceParallel's all-gathered matmul inputs (2 (b T / cp, C) a block), kept
        # whole for backward by the blocks not checkpointed, and by a recomputed group
        a = 4 if c.precision == "fp32" else 2
        gathered = 2 * b * context / lay.cp * shape.d_model * a * (1 - 1 / t)
        if not c.checkpoint:  # as many as the blocks' activations held at each event
            weighted[:, act] += gathered * share.layers * body / max(body.max(), 1.0)
        elif lines.backward is not None:
            weighted[lines.backward, act] += gathered * min(c.checkpoint, share.blocks)
    weighted[:, tmp] = tokens * (live[:, tmp] - head_tmp + head_tmp * share.head)
    weighted[lines.optimizer, tmp] = live[lines.optimizer, tmp] * opt_temps
    g = _CATEGORIES.index("gradients")
    if c.grad_accum > 1 or lay.pp > 1:  # earlier micro-batches' gradients stay to the end
        full = weighted[:, g].max()
        weighted[lines.training, g] = np.maximum(weighted[lines.training, g], full)
    total = weighted.sum(axis=1)
    peak = float(total.max()) + extra
    if strategy.buckets and readable and lay.dp > 1:
        # the flat copy of the gradients, made once backward is over: only states are left then
        end = int(np.argmax(lines.optimizer)) - 1
        held = [_CATEGORIES.index(x) for x in (*STATES, "inputs & buffers")]
        peak = max(peak, float(weighted[end, held].sum() + weighted[end, g]))
    elif strategy.buckets and lay.dp > 1:  # torch DDP's buckets, always there
        peak += float(weighted[:, g].max())
    return peak


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
