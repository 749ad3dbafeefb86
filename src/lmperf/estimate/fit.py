"""Does it fit? A rank's simulated peak for any micro-batch, strategy and accumulation.

One simulated step (`estimate.simulate`) at micro-batch 1 and one at micro-batch 2 give every
event's live bytes per category; the step's ops do not depend on the batch, so the two
timelines have the same events, and each tensor's size is either fixed (parameters, states) or
proportional to the batch (activations, temporaries): the live bytes at event e for micro-batch
b are exactly  live_e(1) + (b - 1) (live_e(2) - live_e(1))  (up to the CUDA allocator's 512-byte
rounding). A rank of a parallel strategy keeps a fraction of each category (`estimate.shards`),
so its peak for any b is one weighted maximum over the events: no simulation is repeated.

Gradient accumulation: from the second micro-batch on, the gradients of the previous ones are
alive through forward and backward (each rank's share of them), so with `accum` > 1 the
gradient column is at least the full gradients' bytes in those phases.

FSDP's mixed-precision policy ('bf16-fsdp': parameters gathered in bf16 for compute, fp32
sharded master weights, gradients reduced in fp32) is simulated as a bf16 step (the activations
of bf16 compute: half of autocast's fp32 residual stream) whose states are then counted as
fp32 shards: parameters, gradients and AdamW's moments x 2 / N, plus the units being gathered.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from lmperf.estimate.formulas import Shape
from lmperf.estimate.shards import allowance_bytes, keep_fractions

# plan precision -> (the regime simulated, bytes per element of the simulated states)
PRECISIONS: dict[str, tuple[str, int]] = {"fp32": ("fp32", 4), "bf16-mixed": ("bf16-mixed", 4),
                                          "bf16-fsdp": ("bf16-true", 2)}
_STATES = ("parameters", "gradients", "optimizer state")
_CATEGORIES = ("parameters", "gradients", "optimizer state", "activations", "autocast copies",
               "temporaries", "inputs & buffers")


@dataclass(frozen=True)
class Workload:
    """What is simulated: the model (`size` of the `course` edition, or a factory `model`),
    the context, attention, and the device whose allocator and autocast lists apply."""

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

    regime = PRECISIONS[precision][0]
    one, two = (simulate_step(work.spec(b, regime), checkpoint_group=checkpoint) for b in (1, 2))
    a, b = (r.timeline[list(_CATEGORIES)].to_numpy(dtype=float) for r in (one, two))
    if a.shape != b.shape:  # the ops changed with the batch: cannot interpolate
        raise ValueError("the step's events differ between micro-batches 1 and 2")
    phase = one.timeline["phase"].to_numpy()
    return Timelines(a, b - a, phase == "optimizer", np.isin(phase, ("forward", "backward")),
                     one.seconds + two.seconds)


def rank_peak(lines: Timelines, shape: Shape, strategy: str, n: int, t: int, batch: int,
              accum: int, precision: str, device: str, context: int) -> tuple[float, float]:
    """(peak live bytes of one rank, allowance) for micro-batch `batch`, `accum` micro-batches
    per step, `strategy` over `n` ranks (t-way tensor parallel for tp and fsdp+tp). The
    allowance is the CUDA context, workspaces and fragmentation (0 on a CPU)."""
    keep, opt_temps, extra = keep_fractions(strategy, shape, n, t, batch * context)
    scale = 1.0
    if precision == "bf16-fsdp":  # bf16 states simulated, fp32 shards held: x 2
        scale = 2.0
        unit = extra / 8 if extra else 0.0  # parameters of the gathered unit(s)
        extra = 2 * 2 * unit + 2 * unit  # two units' bf16 weights, one unit's bf16 gradients
    live = lines.base + (batch - 1) * lines.slope  # (events, categories)
    weights = np.array([keep.get(c, 1.0) * (scale if c in _STATES else 1.0) for c in _CATEGORIES])
    weighted = live * weights
    temps = _CATEGORIES.index("temporaries")
    weighted[lines.optimizer, temps] = live[lines.optimizer, temps] * opt_temps
    if accum > 1:  # earlier micro-batches' gradients stay through forward and backward
        g = _CATEGORIES.index("gradients")
        full = weighted[:, g].max()
        weighted[lines.training, g] = np.maximum(weighted[lines.training, g], full)
    peak = float(weighted.sum(axis=1).max()) + extra
    return peak, (allowance_bytes(peak) if device == "cuda" else 0.0)
