"""Does it fit? A rank's simulated peak for any micro-batch, strategy and accumulation, and THE
verdict (`fits`). How the two simulations are read off for every micro-batch and what each
strategy keeps: docs/commands/plan.md, "How each number is made"."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache, partial

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


def period(policy: str | int) -> int:
    """The blocks after which a checkpointing policy (canonical) repeats itself: G for groups of
    G, K for every-K, else 1."""
    from lmperf.validate import checkpoint_every

    return policy if isinstance(policy, int) else checkpoint_every(policy) or 1


@lru_cache(maxsize=64)
def timelines(work: Workload, precision: str, checkpoint: str | int) -> Timelines:
    """The affine timeline of `work` in plan precision `precision` under the checkpointing
    policy `checkpoint` (canonical: none, full, op, every-K, G), cached for the process:
    micro-batch 1 and 2 simulated, each
    whole, or for the reference LM deeper than three groups grown from the models of two and
    three groups (`_grown`: the same events, block for block, in seconds instead of minutes),
    then reduced to the events that can be a peak (`_frontier`)."""
    import time

    from lmperf.errors import SpecError
    from lmperf.estimate.simulate import simulate_step

    from lmperf.validate import checkpoint_policy

    t0 = time.perf_counter()
    checkpoint = checkpoint_policy(checkpoint)
    regime = PRECISIONS[precision]
    spec = work.spec(1, regime)
    group, layers = period(checkpoint), spec.num_layers
    short = layers % group + 2 * group  # the small models keep the last, partial group
    lines = None
    # the loss on fp32 logits, as the engines a plan runs on take it (torchtitan, dist train):
    # a bf16 plan's output holds the (b, T, V) logits in fp32 beside their bf16 ones
    sim = partial(simulate_step, checkpoint=checkpoint, upcast=True)
    if work.model is None and layers > short + group:
        try:
            lines = [_grown(*(sim(replace(work.spec(b, regime), num_layers=n))
                              for n in (short, short + group)), layers, group)
                     for b in (1, 2)]
        except _NotPeriodic:
            lines = None
    if lines is None:
        lines = [_frame(sim(work.spec(b, regime)).timeline) for b in (1, 2)]
    (a, phase), (b, phase2) = lines
    if a.shape != b.shape or (phase != phase2).any():  # the ops changed with the batch
        raise SpecError("cannot plan this model: its step runs other ops at micro-batch 1 and 2")
    return _frontier(a, b - a, phase, time.perf_counter() - t0)


class _NotPeriodic(Exception):
    """The deeper model's events are not the shallower's with one group's inserted."""


def _frame(timeline) -> tuple[np.ndarray, np.ndarray]:
    """(live bytes per column of _CATEGORIES + _HEAD at each event, each event's phase)."""
    return (timeline[list(_CATEGORIES + _HEAD)].to_numpy(dtype=float),
            timeline["phase"].to_numpy())


def _grown(smaller, bigger, layers: int, group: int) -> tuple[np.ndarray, np.ndarray]:
    """The timeline (live bytes per column, phases) of the reference LM at `layers` blocks from
    the simulations of it at three groups of `group` blocks (`bigger`, with the partial group
    the deep model ends with) and at two (`smaller`). Both are cut at the blocks' marks
    (`simulate._block_marks`): group 1 of the bigger model (the steady one) is repeated, in
    forward and in backward, as often as the deep model has groups beyond three; every other
    piece (before the blocks, the output, the optimizer) is the bigger model's with what one
    more group adds to it over the smaller's (autocast's cached casts, one event per weight
    tensor in the optimizer's lists) repeated as often; the start (the states) grows alike.
    _NotPeriodic when the events do not line up."""
    n = (layers - layers % group) // group  # the deep model's whole groups
    (a, pa, sa), (b, pb, sb) = (_cut(r, group) for r in (smaller, bigger))
    pieces, kinds = [], []
    for name in sb:
        (da, qa), (db, qb) = sa.get(name, (np.zeros((0, b.shape[1])), pb[:0])), sb[name]
        if name.startswith("steady"):  # forward's and backward's group 1, again
            pieces += [db] * (n - 2)
            kinds += [qb] * (n - 2)
        elif not name.startswith("group"):
            grown, phases = _inserted(da, qa, db, qb, n - 3)
            pieces.append(grown)
            kinds.append(phases)
        else:
            pieces.append(db)
            kinds.append(qb)
    start = b[0] + (b[0] - a[0]) * (n - 3)
    live = np.vstack([start[None, :], start + np.cumsum(np.vstack(pieces), axis=0)])
    return live, np.concatenate([pb[:1], *kinds])


def _cut(result, group: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """(live, phases, name -> (events' changes, phases)) of a simulated step cut at its blocks'
    marks, in order: before the blocks, forward of groups 0, 1 ('steady' in the model of three
    groups), 2, the partial group and the output, the output's backward, the groups' backward
    (the partial one, 2, 1, 0) and the rest (the embedding's backward, the optimizer)."""
    live, phase = _frame(result.timeline)
    d, q = np.diff(live, axis=0), phase[1:]
    f, g, head = result.marks["forward"], result.marks["backward"], result.marks["head_forward"]
    groups = len(f) // group  # 2 or 3 whole groups, then the partial one
    fwd = [f[i * group] for i in range(groups)] + [f[groups * group] if len(f) > groups * group
                                                   else head, head]
    back = [g[len(f) - 1]] + [g[k * group - 1] for k in range(groups, 0, -1)] + [g[-1]]

    def name(k: int, suffix: str = "") -> str:
        return ("steady" if (k, groups) == (1, 3) else f"group {k}") + suffix

    cuts = ([("before", 0, fwd[0])] + [(name(i), fwd[i], fwd[i + 1]) for i in range(groups)]
            + [("partial", fwd[groups], head), ("output", head, int(np.argmax(q == "backward"))),
               ("output backward", int(np.argmax(q == "backward")), back[0]),
               ("partial backward", back[0], back[1])]
            + [(name(k, " backward"), back[groups - k], back[groups - k + 1])
               for k in range(groups - 1, -1, -1)] + [("after", back[-1], len(d))])
    if any(x > y for _, x, y in cuts):
        raise _NotPeriodic("marks out of order")
    return live, phase, {key: (d[x:y], q[x:y]) for key, x, y in cuts}


def _inserted(da, qa, db, qb, times: int) -> tuple[np.ndarray, np.ndarray]:
    """The events of a piece of a model `times` groups deeper than `db`'s, from `da`'s (one
    group shallower): `db`'s are `da`'s with runs inserted (autocast's casts, the optimizer's
    per-tensor lists), each repeated `times` times more. _NotPeriodic when they are not."""
    (da, qa), (db, qb) = _canonical(da, qa), _canonical(db, qb)
    ka = [(p, *row) for p, row in zip(qa, da.tolist())]
    kb = [(p, *row) for p, row in zip(qb, db.tolist())]
    if ka == kb:
        return db, qb
    for window in (32, 8, 2):
        try:
            return _insert(ka, kb, db, qb, times, window)
        except _NotPeriodic:
            continue
    raise _NotPeriodic("runs do not line up")


def _canonical(d: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`d`'s events with each run of frees (or of allocations) in one phase sorted: inside such
    a run live bytes only fall (or rise), so every event in it is at most its first (or last)
    whatever the order, and the order autocast's cache or a finalizer frees in says nothing."""
    sign = np.sign(d.sum(axis=1))
    order, start = [], 0
    for i in range(1, len(d) + 1):
        if i == len(d) or sign[i] != sign[start] or q[i] != q[start]:
            run = list(range(start, i))
            order += sorted(run, key=lambda k: tuple(d[k])) if i - start > 1 else run
            start = i
    return d[order], q[order]


def _insert(ka, kb, db, qb, times: int, window: int) -> tuple[np.ndarray, np.ndarray]:
    """See `_inserted`: the shortest run of `kb` after which both go on alike for `window`
    events (or to the end) is an insertion."""
    pieces, phases, i, j = [], [], 0, 0
    while i < len(ka) or j < len(kb):
        if i < len(ka) and j < len(kb) and ka[i] == kb[j]:
            pieces.append(db[j:j + 1])
            phases.append(qb[j:j + 1])
            i, j = i + 1, j + 1
            continue
        w = min(window, len(ka) - i)
        k = next((k for k in range(1, len(kb) - j - w + 1)
                  if kb[j + k:j + k + w] == ka[i:i + w]), None)
        if k is None:
            raise _NotPeriodic(f"event {i}")
        pieces += [db[j:j + k]] * (1 + times)
        phases += [qb[j:j + k]] * (1 + times)
        j += k
    return np.vstack(pieces), np.concatenate(phases)


def _frontier(base: np.ndarray, slope: np.ndarray, phase: np.ndarray,
              seconds: float) -> Timelines:
    """The Timelines of `base` and `slope`, keeping only events that can be a rank's peak:
    within each phase (whose events a rank weights alike), an event whose live bytes and
    slope are at most another's in every column is never the maximum of a weighted sum with
    weights >= 0, at any micro-batch."""
    points = np.hstack([base, slope])
    keep = np.zeros(len(points), dtype=bool)
    for name in np.unique(phase):
        idx = np.flatnonzero(phase == name)
        # an event followed (in its phase) by one that only adds is dominated by it
        later = idx[1:][(points[idx[1:]] >= points[idx[:-1]]).all(axis=1)]
        dominated = set((later - 1).tolist())
        rest = [i for i in idx if i not in dominated]
        rest.sort(key=lambda i: -points[i].sum())
        front: list[int] = []
        for i in rest:
            if not front or not (points[front] >= points[i]).all(axis=1).any():
                front.append(i)
        keep[front] = True
    idx = np.flatnonzero(keep)
    phase = phase[idx]
    return Timelines(base[idx], slope[idx], phase == "optimizer",
                     np.isin(phase, ("forward", "backward")), seconds, phase == "backward")


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
    the blocks it runs; under a pipeline, whether it runs the embedding (`embedding`), the
    stage forwards it holds at once (`in_flight`, `Layout.in_flight`), its stages (`chunks`)
    and the step's micro-batches (`micro_batches`); `ranks`: the pipeline ranks alike in all
    this (what `rank_shares` folds into one)."""

    states: float
    layers: float
    head: bool
    params: float
    blocks: int
    embedding: bool = True
    in_flight: int = 1
    chunks: int = 1
    micro_batches: int = 1
    ranks: int = 1


@lru_cache(maxsize=4096)
def rank_shares(shape: Shape, c: Candidate, global_batch: int | None = None,
                every: bool = False) -> list[RankShare]:
    """The distinct ranks of candidate `c`'s layout (one without a pipeline; one per pipeline
    rank that differs in blocks, in-flight micro-batches, the embedding or the output). A
    pipeline rank's stages hold their blocks' parameters and, the first the embedding, the last
    the output (V C + C); what it holds in flight is its schedule's (`Layout.in_flight`) for the
    step's micro-batches (the rank's batch / b; `global_batch` None: as many as the pipeline
    needs). `every`: one per pipeline rank, in rank order, alike or not."""
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
    alike: dict[tuple, int] = {}
    for r in range(lay.pp):
        mine = [stages[i] for i in lay.rank_stages(r)]
        blocks = sum(s.layers for s in mine)
        first, last = any(s.embedding for s in mine), any(s.head for s in mine)
        params = blocks * block + embed * first + (outside - embed) * last
        chunks = lay.in_flight(r, m)
        held = chunks * blocks / len(mine)  # chunks in flight x blocks per chunk
        share = RankShare(params / shape.params * tp, held, last, params, blocks, first, chunks,
                          len(mine), m)
        key = r if every else (share.states, share.layers, share.head, share.embedding,
                               share.in_flight)
        found.setdefault(key, share)
        alike[key] = alike.get(key, 0) + 1
    return [replace(s, ranks=alike[k]) if alike[k] > 1 else s for k, s in found.items()]


def rank_peak(lines: Timelines, shape: Shape, c: Candidate, context: int, device: str,
              global_batch: int | None = None) -> tuple[float, float]:
    """(peak live bytes of the fullest rank, allowance: the CUDA context, workspaces and
    fragmentation, 0 on a CPU) of candidate `c` at `context` tokens: the simulated step of one
    micro-batch re-weighted by what a rank keeps of each category (`rank_shares`, the
    strategy's shards, 1 / (t cp) of the activations and temporaries: sequence, loss and context
    parallelism split every token-sized tensor), the maximum taken again. Beyond the
    single-device step: torch DDP's gradient buckets (for its whole life), FSDP2's gathered and
    prefetched units, or under a pipeline its stages' whole weights and fp32 gradients (FSDP2
    under PP reshards neither after forward nor until the last micro-batch: torchtitan), torch's
    sequence parallelism's gathered matmul inputs kept whole for backward (2 (b T C) per block
    not checkpointed), ZeRO-1's optimizer state as torch's ZeroRedundancyOptimizer assigns it
    (whole tensors, `Shape.owner_share`)."""
    from lmperf.estimate.simulate import allowance_bytes

    peak = max(_rank_peak(lines, shape, c, share, context)
               for share in rank_shares(shape, c, global_batch))
    return peak, allowance_bytes(peak, device)


def _rank_peak(lines: Timelines, shape: Shape, c: Candidate, share: RankShare,
               context: int) -> float:
    """One rank's peak (see `rank_peak`): the larger of the step's first micro-batch and, when
    the step accumulates (`grad_accum` > 1, or a pipeline's micro-batches), a later one, which
    runs with the earlier micro-batches' gradients held (`_micro_batch_peak`)."""
    first = _micro_batch_peak(lines, shape, c, share, context, later=False)
    if c.grad_accum == 1 and c.layout.pp == 1:
        return first
    return max(first, _micro_batch_peak(lines, shape, c, share, context, later=True))


def _micro_batch_peak(lines: Timelines, shape: Shape, c: Candidate, share: RankShare,
                      context: int, later: bool) -> float:
    """One rank's peak while it runs the step's first micro-batch (`later` False: its gradients
    are the timeline's own, made as backward goes) or a later one (the earlier ones' gradients
    held, `later`), then its optimizer step. The derivations: docs/commands/plan.md, "Memory"."""
    lay, b, strategy = c.layout, c.micro_batch, strategy_of(c.strategy)
    t, L, S = lay.tp, shape.num_layers, c.shard_degree
    tokens = 1 / (t * lay.cp)  # each token-sized tensor's share
    a = 4 if c.precision == "fp32" else 2  # bytes of an activation in the compute dtype
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
    staged = strategy.gathers and lay.pp > 1  # FSDP2 under PP: whole stages, below
    if staged:
        extra = 0.0
    if c.strategy == "zero1":  # whole tensors to owners: the largest owner's share
        keep["optimizer state"] = opt_temps = share.states * shape.owner_share(S)
    live = lines.base + (b - 1) * lines.slope  # (events, categories + head's two)
    cats = len(_CATEGORIES)
    head_act, head_tmp = live[:, cats], live[:, cats + 1]
    weights = np.array([keep.get(cat, 1.0) * (scale if cat in STATES else 1.0)
                        for cat in _CATEGORIES])
    weighted = live[:, :cats] * weights
    act, tmp = _CATEGORIES.index("activations"), _CATEGORIES.index("temporaries")
    g, p = _CATEGORIES.index("gradients"), _CATEGORIES.index("parameters")
    backward = lines.backward if lines.backward is not None else np.zeros(len(live), bool)
    # The micro-batch the rank runs now is the timeline's (its blocks' share of the blocks'
    # activations, the output's where the rank has it): while its backward starts every stage
    # forward of it on the rank is held. A pipeline rank also holds `others` stage forwards of
    # other micro-batches whole: its schedule's in flight (`Layout.in_flight`, capped by the
    # step's m v stage forwards) less this micro-batch's (v, one per stage), or less one at the
    # end of its backward (its first stage's: the embedding's event), each of a stage that is
    # not the output's (its forward is followed by its backward at once, but under GPipe); once
    # a micro-batch's backward has run (`later`) one fewer can be in flight (1F1B: F_k ..
    # F_(k+p-r-1) around B_k, k >= 1).
    body = live[:, act] - head_act
    # The gradients each weight's backward makes, in event order: the output's first, the
    # embedding's last (a block's in between), in the dtype autograd makes them in (the
    # weights' in compute: bf16 under FSDP's bf16 policy, else fp32)
    made = np.diff(live[:, g], prepend=live[0, g]).clip(min=0) * backward
    order = np.flatnonzero(made)
    forwards = share.micro_batches * share.chunks  # the step's stage forwards on this rank
    in_flight = share.in_flight if not later else min(share.in_flight, forwards - 1)
    others = np.full(len(live), max(0, in_flight - share.chunks), dtype=float)
    if order.size:
        others[order[-1]] = max(0, in_flight - 1)
    if later and share.embedding and order.size and share.in_flight >= forwards:
        # every forward first (GPipe, or a warm-up that covers them all): the embedding's stage
        # runs the rank's last backwards, only its own later micro-batches still in flight
        others[order[-1]] = max(0, share.micro_batches - 2)
    # blocks of another micro-batch's stage forward (the output's stage aside)
    per_chunk = share.blocks / max(1, share.chunks - share.head) if share.chunks > 1 \
        else share.blocks
    # only GPipe runs every forward first: its output stage holds other micro-batches' outputs
    heads = others if lay.pp_schedule == "GPipe" else 0
    step = lines.training  # what is in flight lives through forward and backward only
    weighted[:, act] = tokens * (body * share.blocks / L + head_act * share.head + step * (
        others * per_chunk / L * body.max() + heads * head_act.max() * share.head))
    if lay.pp > 1:  # each stage forward in flight keeps its output for its backward (torch's
        # PipelineStage.fwd_cache): the logits (b, T / cp, V / t) on the output's stage, else the
        # sequence-split (b, T / (cp t), C) the next stage receives
        outputs, logits = 1 + others, share.head * (1 + heads)
        weighted[:, act] += step * b * context / lay.cp * a / t * (
            logits * shape.vocab_size + (outputs - logits) * shape.d_model)
        # and torch's PipelineStage allocates its receive buffers once for all m micro-batches
        # (_prepare_forward_infra / _prepare_backward_infra): the activation into every stage
        # but the first, its output's gradient into every stage but the last, (b, T / cp, C / t)
        buffers = 2 * share.chunks - share.embedding - share.head
        weighted[:, act] += share.micro_batches * buffers * b * context / lay.cp * shape.d_model \
            * a / t
    if t > 1:  # SequenceParallel's all-gathered matmul inputs (2 (b T / cp, C) a block), kept
        # whole for backward by the blocks not checkpointed, and by a recomputed group
        gathered = 2 * b * context / lay.cp * shape.d_model * a * (1 - 1 / t)
        if c.checkpoint in ("none", 0):  # as many as the blocks' activations held at a time
            held = share.blocks * body / max(body.max(), 1.0) + step * others * per_chunk
            weighted[:, act] += gathered * held
        elif lines.backward is not None:
            weighted[lines.backward, act] += gathered * min(period(c.checkpoint), share.blocks)
    weighted[:, tmp] = tokens * (live[:, tmp] - head_tmp + head_tmp * share.head)
    if t > 1 and share.head and head_tmp[backward].max(initial=0.0) > 0:
        # loss parallelism's backward (torch's _nll_loss_and_log_softmax_backward) holds one
        # more (b, T / cp, V / t) fp32 tensor than aten's: zeros_like + exp + their sum beside
        # the saved log-softmax, where nll_loss_backward and _log_softmax_backward_data hold two
        at = np.flatnonzero(backward)[np.argmax(head_tmp[backward])]
        weighted[at, tmp] += b * context / lay.cp * shape.vocab_size / t * 4
    weighted[lines.optimizer, tmp] = live[lines.optimizer, tmp] * opt_temps
    own = weighted[:, g].copy()
    if staged:  # FSDP2 under PP keeps the stage's weights gathered (in the compute dtype) and
        # its gradients whole (fp32) through every micro-batch (torchtitan: no reshard after
        # forward, one reduce-scatter per step); its shards' gradients exist from those
        # reduce-scatters on, after backward
        whole = share.params / t
        so_far = live[:, g] / max(live[:, g].max(), 1.0)  # the step's gradients made by now
        weighted[lines.training, g] = 4 * whole * (1.0 if later else so_far[lines.training])
        weighted[lines.training, p] += whole * (2 if c.precision != "fp32" else 4)
    elif later:  # earlier micro-batches' gradients stay to the end
        weighted[lines.training, g] = np.maximum(own[lines.training], own.max())
    if later and (staged or "gradients" not in strategy.shards) and order.size:
        # accumulation: a weight's new gradient is made whole, then added into the one held
        # (autograd's AccumulateGrad: grad += new), both alive at once: the output's (1 / t
        # of it under TP), a block's, the embedding's (whole under TP, below)
        share_of = np.where(backward, (share.blocks > 0) / t, 0.0)
        share_of[order[0]] = share.head / t
        share_of[order[-1]] = float(share.embedding)
        weighted[:, g] += made * share_of
    vc = shape.vocab_size * shape.d_model * (2 if scale > 1 else 4)  # a (V, C) gradient
    embedding = share.embedding and sum(n == vc / 4 / scale for n in shape.numels) != 1  # untied
    fsdp2 = strategy.gathers and not staged
    if t > 1 and embedding and order.size and not fsdp2:
        # DTensor computes the row-wise embedding's gradient Replicate: the whole (V, C) on
        # every TP rank (torch 2.13), from its backward to the optimizer's zero_grad
        since = np.arange(len(live)) >= (0 if later else order[-1])
        keep_till = lines.training | (lines.optimizer if not staged else False)
        weighted[since & keep_till, g] += vc * (1 - 1 / t)
    if fsdp2 and share.head and order.size:
        # FSDP2 reduce-scatters the root unit (embedding, final norm, head) last, after the
        # embedding's backward: the head's gradient stays unsharded (its 1/t) from its own
        # backward to then, and the embedding's joins it, whole (under TP DTensor makes it
        # Replicate, and FSDP copies its TP shard out before the reduce-scatter)
        weighted[(np.arange(len(live)) >= order[0]) & backward, g] += vc / t
        weighted[order[-1], g] += vc * (1 + 1 / t if t > 1 else 1) * embedding
    total = weighted.sum(axis=1)
    peak = float(total.max()) + extra
    if strategy.buckets and lay.dp > 1:  # torch DDP's buckets (the gradients' size), always there
        peak += float(own.max())
    return peak


def device_fit(spec, budget_gib: float | None, checkpoint: str | int = "none") -> dict:
    """Does one step of `spec` (a RunSpec, single device) fit in `budget_gib`? Its simulated peak
    plus, on CUDA, the allowance, held against the budget: the same answer `memory --estimate`,
    `dist --estimate` at one device and `plan` give. {} when the model cannot be simulated."""
    from lmperf.errors import SpecError
    from lmperf.estimate.simulate import simulate_step

    try:
        res = simulate_step(spec, checkpoint=checkpoint)
    except SpecError:
        return {}
    total = res.total_bytes / 2**30  # peak + allowance, as memory --estimate's "fits"
    return {"peak_gib": total, "simulated_gib": res.peak_bytes / 2**30, "budget_gib": budget_gib,
            "fits": fits(total, budget_gib)}


def shape_of(work: Workload) -> Shape:
    """The Shape (parameters counted on a meta model, widths from the config) of `work`."""
    import torch

    from lmperf.model.custom import build_model

    spec = work.spec(1, "fp32")
    config = spec.model_config()
    with torch.device("meta"):
        model = build_model(config, spec.model)
    numels = tuple(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    return Shape(spec.model or spec.size, sum(numels), config.d_model, config.d_ff,
                 config.num_layers, config.num_heads, config.vocab_size,
                 num_kv_heads=config.num_kv_heads or 0, numels=numels)
