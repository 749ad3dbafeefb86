"""THE layout of a parallel training step, named once as torchtitan's `ParallelDims` names it:
data-parallel replicate x shard, tensor (with sequence and loss parallelism), pipeline (degree,
schedule, stages per rank, micro-batch) and context-parallel degrees, validated once. Every
piece of layout arithmetic (the data-parallel degree, micro-batches, accumulation, the stage
split, what a pipeline rank holds in flight and how long it idles) lives here and nowhere else;
`plan`, `dist --estimate` and `dist train` read it. The derivations: docs/commands/plan.md,
"Layouts"."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache

from lmperf.errors import SpecError
from lmperf.names import PP_SCHEDULES
from lmperf.validate import as_flag, check_fields

# Schedules with several stages per rank (torch's PipelineScheduleMulti); the V-shaped one places
# exactly 2 per rank, stage r and 2p - 1 - r (torchtitan's _get_pp_rank_to_stage_indices_mapping)
LOOPED = ("Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble")
V_SHAPED = ("ZBVZeroBubble",)
FIELDS = ("dp_replicate", "dp_shard", "tp", "pp", "cp", "pp_schedule", "pp_virtual", "async_tp")


def schedule_name(name: str) -> str:
    """torch's spelling of a pipeline schedule given in any case ('1f1b' -> '1F1B'); SpecError
    naming the accepted ones."""
    found = {s.lower(): s for s in PP_SCHEDULES}.get(str(name).lower())
    if found is None:
        raise SpecError(f"unknown pipeline schedule {name!r}; accepted: {', '.join(PP_SCHEDULES)}")
    return found


class LayoutError(SpecError):
    """A layout that cannot run a model or a batch: `what` (the degree, e.g. 'tp 8') and `why`
    ('does not divide the model's 4 attention heads'), one line together; a search counts
    what it leaves out by `why`."""

    def __init__(self, what: str, why: str):
        super().__init__(f"{what} {why}")
        self.what, self.why = what, why


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: its blocks [first, first + layers), whether it holds the embedding
    and the output (the final norm, the head and the loss)."""

    first: int
    layers: int
    embedding: bool
    head: bool


@dataclass(frozen=True)
class Layout:
    """How `gpus` devices split a training step. `tp`: tensor-parallel degree (Megatron's
    column / row split, with sequence parallelism between the blocks and loss parallelism over
    the vocabulary, as torchtitan applies them); `pp`: pipeline stages' ranks, run by
    `pp_schedule` (torch's name) with `pp_virtual` stages per rank; `cp`: context-parallel
    degree (the sequence split, ring attention); `dp_replicate`: replicas of the data-parallel
    group; the data-parallel shard degree is what is left (`dp_shard`). `async_tp` overlaps
    TP's collectives with its matmuls (torch's micro-pipelined async TP). A layout of one degree
    everywhere is one device. Raises SpecError when the degrees do not multiply to `gpus`."""

    gpus: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    dp_replicate: int = 1
    pp_schedule: str | None = None
    pp_virtual: int = 1
    async_tp: bool = False

    def __post_init__(self) -> None:
        check_fields(self, positive=("gpus", "tp", "pp", "cp", "dp_replicate", "pp_virtual"),
                     named=as_flag)
        fixed = self.tp * self.pp * self.cp * self.dp_replicate
        if self.gpus % fixed:
            raise SpecError(f"tp {self.tp} x pp {self.pp} x cp {self.cp} x dp-replicate "
                            f"{self.dp_replicate} = {fixed} does not divide {self.gpus} GPUs")
        if self.pp == 1:  # no pipeline: no schedule (one value, so equal layouts compare equal)
            object.__setattr__(self, "pp_schedule", None)
            object.__setattr__(self, "pp_virtual", 1)
        else:
            name = schedule_name(self.pp_schedule or "1F1B")
            object.__setattr__(self, "pp_schedule", name)
            if name not in LOOPED and self.pp_virtual != 1:
                raise SpecError(f"{name} runs one stage per rank: --pp-virtual 1, or a looped "
                                f"schedule ({', '.join(LOOPED)})")
            if name in LOOPED and self.pp_virtual < 2:
                raise SpecError(f"{name} runs several stages per rank: --pp-virtual 2 or more")
            if name in V_SHAPED and self.pp_virtual != 2:
                raise SpecError(f"{name} places exactly 2 stages per rank: --pp-virtual 2")
        if self.tp == 1 and self.async_tp:
            object.__setattr__(self, "async_tp", False)

    @property
    def dp_shard(self) -> int:
        """The data-parallel shard degree: the GPUs the other degrees leave."""
        return self.gpus // (self.tp * self.pp * self.cp * self.dp_replicate)

    @property
    def dp(self) -> int:
        """The data-parallel degree: replicas of the model the global batch is split over."""
        return self.dp_replicate * self.dp_shard

    @property
    def stages(self) -> int:
        """Pipeline stages in all: pp x stages per rank."""
        return self.pp * self.pp_virtual

    def fields(self) -> dict:
        """The layout's record fields, under the flags' names (dp_shard included)."""
        out = asdict(self)
        del out["gpus"]
        return {k: (self.dp_shard if k == "dp_shard" else out[k]) for k in FIELDS}

    def label(self) -> str:
        """A short name: 'fsdp 8', 'dp 2 x fsdp 4 x tp 8 x pp 8 (Interleaved1F1B v2)'."""
        parts = [f"{n} {v}" for n, v in (("replicate", self.dp_replicate), ("shard", self.dp_shard),
                                          ("tp", self.tp), ("cp", self.cp), ("pp", self.pp)) if v > 1]
        text = " x ".join(parts) or "one device"
        if self.pp > 1:
            text += f" ({self.pp_schedule}" + (f" v{self.pp_virtual}" if self.pp_virtual > 1
                                               else "") + ")"
        return text + (", async TP" if self.async_tp else "")

    # --- what a model and a batch must satisfy --------------------------------------------
    def check(self, *, num_layers: int, num_heads: int, num_kv_heads: int | None, context: int,
              global_batch: int, micro_batch: int | None = None) -> None:
        """Refuse (SpecError, one line naming the degree) what this layout cannot run for that
        model and batch: heads and K/V heads divide by tp; the sequence divides by tp (sequence
        parallelism) and by 2 cp (causal load balancing cuts it into 2 cp chunks); the stages
        are no more than the blocks + 2 (the embedding and the output each count as a layer);
        the global batch divides by the data-parallel degree, and under PP the rank's batch by
        the micro-batch."""
        kv = num_kv_heads or num_heads
        for what, n in (("attention heads", num_heads), ("K/V heads", kv)):
            if n % self.tp:
                raise LayoutError(f"tp {self.tp}", f"does not divide the model's {n} {what}")
        if context % self.tp:
            raise LayoutError(f"tp {self.tp}", f"(sequence parallelism) does not divide context "
                                               f"{context}")
        if self.cp > 1 and context % (2 * self.cp):
            raise LayoutError(f"cp {self.cp}", f"(2 cp chunks, causal load balancing) does not "
                                               f"divide context {context}")
        if self.stages > num_layers + 2:
            raise LayoutError(f"pp {self.pp} x {self.pp_virtual} stages per rank",
                              f"exceed the model's {num_layers} blocks + embedding + output")
        if global_batch % self.dp:
            raise LayoutError(f"dp {self.dp}", f"data-parallel degree does not divide global "
                                               f"batch {global_batch}")
        if self.pp > 1 and micro_batch is not None and (global_batch // self.dp) % micro_batch:
            raise LayoutError(f"micro-batch {micro_batch}", f"does not divide the rank's batch "
                                                            f"{global_batch // self.dp} (a "
                                                            "pipeline splits it evenly)")
        if self.pp > 1 and micro_batch is not None:
            m = global_batch // self.dp // micro_batch
            why = schedule_refusal(self.pp_schedule, self.pp, m, self.pp_virtual)
            if why:
                raise LayoutError(f"micro-batch {micro_batch}", f"{m} micro-batches: torch "
                                  f"refuses the schedule: {why}")

    # --- the batch --------------------------------------------------------------------------
    def local_batch(self, global_batch: int) -> int:
        """Sequences one data-parallel replica runs per step."""
        return global_batch // self.dp

    def micro_batches(self, global_batch: int, micro_batch: int) -> list[int]:
        """Sizes of the micro-batches a replica runs per step: the pipeline's m = local / b
        (equal), or without a pipeline the gradient accumulation's (the last one smaller when
        b does not divide the local batch)."""
        local = self.local_batch(global_batch)
        n = math.ceil(local / micro_batch)
        return [micro_batch] * (n - 1) + [local - micro_batch * (n - 1)]

    def grad_accum(self, global_batch: int, micro_batch: int) -> int:
        """Gradient accumulation steps outside the pipeline: local / b rounded up without PP, 1
        under PP (its micro-batches are the schedule's)."""
        return 1 if self.pp > 1 else len(self.micro_batches(global_batch, micro_batch))

    # --- the pipeline -----------------------------------------------------------------------
    def split(self, num_layers: int) -> list[Stage]:
        """The stages, as torchtitan splits them (`_generate_llm_fqn_per_model_part`, input and
        output weight 1): the blocks + 2 'effective layers' spread as evenly as they divide, the
        first stages one more, the first and last each giving one to the embedding / output."""
        n = self.stages
        if n == 1:
            return [Stage(0, num_layers, True, True)]
        effective = num_layers + 2
        base, extra = divmod(effective, n)
        out, at = [], 0
        for s in range(n):
            layers = base + (s < extra) - (s == 0) - (s == n - 1)
            layers = max(0, min(layers, num_layers - at))
            out.append(Stage(at, layers, s == 0, s == n - 1))
            at += layers
        return out

    def rank_stages(self, rank: int) -> tuple[int, ...]:
        """The stage indices pipeline rank `rank` runs: r, r + p, ... (looped), or r and
        2p - 1 - r (V-shaped)."""
        if self.pp_schedule in V_SHAPED:
            return (rank, 2 * self.pp - 1 - rank)
        return tuple(rank + s * self.pp for s in range(self.pp_virtual))

    def in_flight(self, rank: int, micro_batches: int) -> int:
        """Stage forwards (one micro-batch through one of its stages) whose activations rank
        `rank` holds at once at its peak, under its schedule with `micro_batches` per step:
        GPipe all of them (every forward before any backward); 1F1B p - r (its warm-up + the
        one in its first backward); interleaved and zero-bubble schedules torch's warm-up + 1,
        (v - 1) p + 2 (p - 1 - r) + 1 (schedules.py: ScheduleInterleaved1F1B's warmup_ops), the
        V-shaped one 2 (p - r) - 1 + ... bounded the same way. None is more than m v."""
        p, v, m = self.pp, self.pp_virtual, micro_batches
        if p == 1:
            return 1
        if self.pp_schedule == "GPipe":
            held = m * v
        elif self.pp_schedule == "1F1B":
            held = p - rank
        elif self.pp_schedule in V_SHAPED:  # ZB-V: as 1F1B's memory, in chunks of half a stage
            held = 2 * (p - rank)
        else:
            held = (v - 1) * p + 2 * (p - 1 - rank) + 1
        return max(1, min(held, m * v))

    def bubble(self, micro_batches: int, forward_s: float, backward_s: float) -> float:
        """Seconds a pipeline rank idles per step (the bubble), for one micro-batch's forward and
        backward of `forward_s` and `backward_s` on that rank (all its stages; the backward's
        weight-gradient part w half of it): GPipe and 1F1B (p - 1)
        (f + b); interleaved 1F1B (p - 1) (f + b) / v (Narayanan et al. 2021); zero-bubble
        interleaved (p - 1) (f + b - w) / v, ZB-H1's (Qi et al. 2024: the weight gradients
        fill the cool-down), with the input gradient's B = b - w, (p - 1) (f + B - w) / v;
        ZB-V's (p - 1) (F + B - 2 W) over its half-stage chunks, (p - 1) (f + b - 3 w) / 2, at
        least 0. These are steady states (m >= p); with fewer micro-batches the step is at least
        one micro-batch's path through every stage, p (f + b) (zero-bubble: p (f + b - w) + w,
        its weight gradients off that path): the bubble is at least that less the rank's own
        m (f + b). 0 without a pipeline."""
        p, v = self.pp, self.pp_virtual
        if p == 1:
            return 0.0
        w = backward_s / 2
        one = forward_s + backward_s  # a micro-batch's work on this rank
        if self.pp_schedule in ("GPipe", "1F1B"):
            return (p - 1) * one
        if self.pp_schedule == "Interleaved1F1B":
            steady, path = (p - 1) * one / v, p * one
        elif self.pp_schedule == "InterleavedZeroBubble":
            steady, path = (p - 1) * (one - 2 * w) / v, p * (one - w) + w
        else:
            steady, path = max(0.0, (p - 1) * (one - 3 * w) / 2), p * (one - w) + w
        return max(steady, path - micro_batches * one)


@lru_cache(maxsize=None)
def schedule_refusal(schedule: str, pp: int, micro_batches: int, virtual: int) -> str | None:
    """Why torch refuses to build pipeline `schedule` (its name) on `pp` ranks with
    `micro_batches` micro-batches and `virtual` stages per rank (1F1B needs one per stage, ...),
    in torch's words; None where it builds it, or where this torch cannot say (before its
    schedule visualizer): it builds the schedule's actions on placeholder stages, nothing runs."""
    try:
        from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops
    except ImportError:
        return None
    try:
        get_schedule_ops(schedule, pp, micro_batches, virtual)
    except (ValueError, AssertionError, RuntimeError) as exc:
        return " ".join(str(exc).split())
    return None

