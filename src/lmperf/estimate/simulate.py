"""Simulate one step's memory: lmperf's own step run on phantom tensors, its live bytes per
category over time, and THE allowance for what it cannot see (docs/commands/plan.md, "The
simulated step")."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import pandas as pd
import torch

from lmperf.errors import LmperfError, SpecError
from lmperf.estimate.phantom import PhantomError, PhantomMode
from lmperf.runtime.precision import Regime, autocast, get_regime
from lmperf.units import MIB
from lmperf.workload.spec import RunSpec

CATEGORIES: tuple[str, ...] = ("parameters", "gradients", "optimizer state", "activations",
                               "autocast copies", "temporaries", "inputs & buffers")
PHASE_AFTER = {"forward": "backward", "backward": "optimizer", "optimizer": "end"}
# the part of the activations and temporaries the output (final norm, head, loss) made: columns
# of a timeline beside CATEGORIES, already counted in theirs
HEAD: tuple[str, ...] = ("head activations", "head temporaries")

# What the simulation cannot see on a GPU, as a stated allowance (assumed, not measured here:
# this machine has no GPU). Basis: the CUDA context lives outside torch's allocator and takes a
# few hundred MiB with CUDA's lazy module loading (the default since CUDA 11.7); cuBLAS and
# cuBLASLt each get a workspace through the caching allocator, 32 MiB recommended on Hopper and
# newer (cublasSetWorkspace; 4 MiB before); the caching allocator rounds large blocks to 2 MiB
# and keeps freed blocks in segments it cannot always reuse (fragmentation).
CUDA_CONTEXT_BYTES = 512 * MIB
CUBLAS_WORKSPACE_BYTES = 2 * 32 * MIB
FRAGMENTATION = 0.10  # of the simulated peak
ALLOWANCE_NOTE = ("allowance (assumed, not measured: no GPU here): CUDA context 512 MiB (outside "
                  "torch's allocator), cuBLAS + cuBLASLt workspaces 2 x 32 MiB, allocator "
                  "fragmentation and segment rounding 10% of the simulated peak; NCCL buffers "
                  "(multi-GPU) are not included")


def allowance_bytes(peak: float, device: str) -> float:
    """THE allowance: bytes a step whose tensors peak at `peak` bytes needs beyond them on
    `device` ('cuda': the CUDA context, cuBLAS workspaces and a fragmentation share, see
    ALLOWANCE_NOTE; 0 elsewhere)."""
    if device != "cuda":
        return 0.0
    return CUDA_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES + FRAGMENTATION * peak


@dataclass
class SimResult:
    """One simulated step, in bytes. `timeline`: one row per allocation/free event from the
    step's start: 'event', 'phase', the live bytes of each category after it, and 'total'."""

    mode: str
    precision: str
    device: str
    batch: int
    context: int
    checkpoint: str | int  # the policy (lmperf.validate.checkpoint_policy's canonical value)
    optimizer: str | None
    timeline: pd.DataFrame
    ops: int
    seconds: float
    notes: list[str] = field(default_factory=list)
    block_forwards: int | None = None  # forwards of the model's blocks in the step (recompute
    num_blocks: int | None = None      # included); None for a model without `layers`
    # where each block's forward and backward begin, as the timeline's event numbers (its row
    # r + 1 is after event r): `_block_marks`; {} for a model without `layers`
    marks: dict = field(default_factory=dict)

    @property
    def recomputed_blocks(self) -> float | None:
        """Block forwards beyond one per block: checkpointing's recompute, in whole forwards
        of the block stack (1.0: every block ran its forward twice)."""
        if not self.block_forwards or not self.num_blocks:
            return None
        return self.block_forwards / self.num_blocks - 1

    def _total(self) -> np.ndarray:
        return self.timeline["total"].to_numpy(dtype=float)

    @property
    def peak_bytes(self) -> int:
        """Peak live bytes over the step (the tensors only; see `allowance_bytes`)."""
        return int(self._total().max())

    @property
    def peak_event(self) -> int:
        """Index (timeline row) of the peak; the first one when several are equal."""
        return int(np.argmax(self._total()))

    @property
    def peak_phase(self) -> str:
        """The phase in which the peak happens."""
        return str(self.timeline["phase"].iat[self.peak_event])

    @property
    def start_bytes(self) -> int:
        """Live bytes when the step starts (parameters, AdamW state, inputs, buffers)."""
        return int(self._total()[0])

    @property
    def phase_peaks(self) -> dict[str, int]:
        """Phase -> peak live bytes within it ('start' first)."""
        total = self._total()
        out = {"start": int(total[0])}
        for phase, idx in self.timeline.groupby("phase", sort=False).indices.items():
            if phase != "start":
                out[str(phase)] = int(round(total[idx].max()))
        return out

    @property
    def composition(self) -> dict[str, int]:
        """Category -> live bytes at the peak."""
        row = self.timeline.iloc[self.peak_event]
        return {c: int(row[c]) for c in CATEGORIES}

    @property
    def allowance_bytes(self) -> int:
        """What the simulation cannot see (`allowance_bytes`; 0 on the CPU)."""
        return int(allowance_bytes(self.peak_bytes, self.device))

    @property
    def total_bytes(self) -> int:
        """The estimate of the device memory the step needs: peak + allowance."""
        return self.peak_bytes + self.allowance_bytes


class _PhaseObserver:
    """The step's observer: its phase boundaries become the mode's phases."""

    def __init__(self, mode: PhantomMode):
        self.mode = mode

    def start(self) -> None:
        self.mode.set_phase("forward")

    def lap(self, phase: str) -> None:
        self.mode.set_phase(PHASE_AFTER.get(phase, "end"))


@contextlib.contextmanager
def _module_depth(mode: PhantomMode, blocks: set[int], calls: list[int]) -> Iterator[None]:
    """Count running module forwards (global hooks), so recompute in backward is recognised;
    `calls[0]` counts the forwards of the modules whose ids are in `blocks`."""
    from torch.nn.modules.module import (register_module_forward_hook,
                                         register_module_forward_pre_hook)

    def pre(module: torch.nn.Module, *_: object) -> None:
        mode.module_depth += 1
        if id(module) in blocks:
            calls[0] += 1

    def post(*_: object) -> None:
        mode.module_depth -= 1

    handles = [register_module_forward_pre_hook(pre), register_module_forward_hook(post)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _build(spec: RunSpec, regime: Regime, mode: PhantomMode, checkpoint: str | int):
    """The model (phantom parameters in the regime's dtype), inputs, targets and AdamW."""
    from lmperf.model.custom import build_model
    from lmperf.model.checkpointing import set_checkpointing
    from lmperf.workload.build import OPTIMIZER_FLAGS

    with torch.device("meta"):  # no initialisation arithmetic, no bytes
        model = build_model(spec.model_config(), spec.model)
    set_checkpointing(model, checkpoint)
    shape = (spec.batch, spec.context)
    with mode:
        model._apply(lambda t: torch.empty_like(
            t, dtype=regime.param_dtype if t.is_floating_point() else t.dtype))
        inputs = torch.zeros(shape, dtype=torch.long)  # (B, T) token ids
        targets = torch.zeros(shape, dtype=torch.long)
    optimizer = None
    if spec.mode == "train-step":
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4,
                                      **OPTIMIZER_FLAGS[spec.optimizer])
    return model, inputs, targets, optimizer


def simulate_step(spec: RunSpec, checkpoint: str | int = "none", *,
                  upcast: bool = False) -> SimResult:
    """Simulate one step of `spec` (its mode, precision, optimizer, attention, device) and
    return its live bytes over time; nothing is allocated. `checkpoint`: the activation
    checkpointing policy (none, full, op, every-K or G blocks per group; any spelling
    `lmperf.validate.checkpoint_policy` accepts, 0 and 1 included), not `spec.checkpoint`.
    `upcast`: the loss on fp32 logits
    (`StepState.upcast`: the multi-GPU engines' step). Raises SpecError when the model cannot
    run on phantom tensors."""
    from lmperf.runtime.cuda_autocast import cuda_fp32_ops
    from lmperf.validate import checkpoint_policy
    from lmperf.workload.steps import STEPS, StepState

    checkpoint = checkpoint_policy(checkpoint)
    t0 = time.perf_counter()
    regime = get_regime(spec.precision)
    device = torch.device(spec.device)
    mode = PhantomMode(torch.device("cpu"), round_blocks=device.type == "cuda")
    notes: list[str] = []
    try:
        model, inputs, targets, optimizer = _build(spec, regime, mode, checkpoint)
        # A disabled scaler: loss scaling (fp16-mixed) multiplies the loss and unscales the
        # gradients in place, a few scalars of memory; its inf check reads values.
        state = StepState(model, inputs, targets, lambda: autocast(regime, torch.device("cpu")),
                          torch.amp.GradScaler("cpu", enabled=False), optimizer,
                          clip=spec.clip_norm(), upcast=upcast)
        params = list(model.parameters())
        grads: set[int] = set()
        hooks = [p.register_post_accumulate_grad_hook(
            lambda p: grads.add(mode.storage_id(p.grad))) for p in params if p.requires_grad]
        with mode:
            if optimizer is not None:  # AdamW's state, as the warm-up step leaves it
                for p in params:
                    p.grad = torch.zeros_like(p)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                grads.clear()
            mode.param_storages = {mode.storage_id(p) for p in params}
            fp32_ops = cuda_fp32_ops() if device.type == "cuda" and regime.autocast_dtype \
                else contextlib.nullcontext()
            layers = getattr(model, "layers", None)
            blocks = {id(m) for m in layers} if isinstance(layers, torch.nn.ModuleList) else set()
            calls = [0]
            marks: dict = {"forward": [], "backward": {}}
            if blocks:  # where each block and the output run: see `_block_marks`
                hooks += _block_marks(mode, layers, marks)
            mode.set_phase("start")
            with _module_depth(mode, blocks, calls), fp32_ops:
                STEPS[spec.mode](state, _PhaseObserver(mode))
        for h in hooks:
            h.remove()
        fixed = {"parameters": mode.param_storages,
                 "inputs & buffers": {mode.storage_id(t) for t in
                                      [inputs, targets, *model.buffers()]},
                 "optimizer state": {mode.storage_id(v) for s in
                                     (optimizer.state.values() if optimizer else ())
                                     for v in s.values() if isinstance(v, torch.Tensor)},
                 "gradients": grads}
        timeline = _timeline(mode, fixed, marks)
    except (PhantomError, NotImplementedError, RuntimeError, TypeError, ValueError) as exc:
        if isinstance(exc, LmperfError):
            raise
        what = spec.model or "the reference LM"
        raise SpecError(f"cannot simulate {what} on phantom tensors: "
                        f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}") from None
    if device.type == "cuda" and regime.autocast_dtype is not None:
        why = ("the phantom tensors are CPU tensors" if torch.backends.cuda.is_built()
               else "this torch has no CUDA backend")
        notes.append("autocast simulated with the CPU's op lists plus CUDA's fp32 list "
                     f"(cuda_autocast.CUDA_FP32_OPS): {why}")
    if regime.loss_scaling:
        notes.append("loss scaling simulated without its scalars (a few bytes)")
    start = mode.log.phase_starts["start"]
    marks = {"forward": [i - start for i in marks["forward"]],
             "backward": {k: i - start for k, i in marks["backward"].items()},
             **({"head_forward": marks["head_forward"] - start} if "head_forward" in marks
                else {})}
    return SimResult(spec.mode, spec.precision, device.type, spec.batch,
                     spec.context, checkpoint,
                     spec.optimizer if spec.mode == "train-step" else None, timeline,
                     mode.ops, time.perf_counter() - t0, notes,
                     calls[0] if blocks else None, len(blocks) or None, marks)


def _block_marks(mode: PhantomMode, layers: torch.nn.ModuleList, marks: dict) -> list:
    """Hooks that mark, as event indices, where each block's forward begins (`forward`, in
    order), where the output (final norm, head, loss) begins (`head_forward`: the last block's
    output exists), and where each block's output gradient exists in backward (`backward`: k ->
    index; `backward[-1]`: block 0's input gradient, when the blocks' backward is over). Between
    `head_forward` and the backward of the last block's output runs the part of the step only a
    pipeline's last stage holds; the blocks' marks let `fit` grow a deep model's timeline from a
    shallow one's. Recompute (in backward) marks nothing."""
    def gradient(k: int):
        return lambda grad: marks["backward"].setdefault(k, len(mode.log.sid)) and None

    def before(k: int):
        def hook(module: torch.nn.Module, inputs: tuple) -> None:
            if mode.phase != "forward" or len(marks["forward"]) > k:
                return
            marks["forward"].append(len(mode.log.sid))
            if k == 0 and inputs and isinstance(inputs[0], torch.Tensor) \
                    and inputs[0].requires_grad:
                inputs[0].register_hook(gradient(-1))
        return hook

    def after(k: int):
        def hook(module: torch.nn.Module, inputs: object, output: object) -> None:
            if mode.phase != "forward" or k in marks["backward"] or marks.get(("out", k)):
                return
            marks[("out", k)] = True
            if k == len(layers) - 1:
                marks["head_forward"] = len(mode.log.sid)
            if isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(gradient(k))
        return hook

    return [h for k, block in enumerate(layers)
            for h in (block.register_forward_pre_hook(before(k)),
                      block.register_forward_hook(after(k)))]


def _category(sid: int, info, fixed: dict[str, set[int]], forward_end: int) -> str:
    for name, sids in fixed.items():
        if sid in sids:
            return name
    if info.cast_of_param and info.phase in ("forward", "backward"):
        return "autocast copies"
    if info.recomputed:
        return "activations"
    if info.phase == "forward" and (info.freed is None or info.freed >= forward_end):
        return "activations"
    return "temporaries"


def _timeline(mode: PhantomMode, fixed: dict[str, set[int]],
              marks: dict[str, int] | None = None) -> pd.DataFrame:
    """Live bytes per category after each event from the step's start (row 0: the start), and
    HEAD's columns: the activations and temporaries made while the output (final norm, head,
    loss) ran its forward or backward (`_head_marks`; 0 for a model without `layers`)."""
    log = mode.log
    n = len(log.sid)
    start = log.phase_starts["start"]
    forward_end = log.phase_starts.get("backward", log.phase_starts.get("end", n))
    marks = marks or {}
    windows = ((marks.get("head_forward", forward_end), forward_end),
               (forward_end, marks.get("backward", {}).get(len(marks.get("forward", [])) - 1,
                                                           forward_end)))
    cat_index = {c: i for i, c in enumerate(CATEGORIES)}
    sid_cat = {}
    for sid, info in mode.storages.items():
        i = cat_index[_category(sid, info, fixed, forward_end)]
        if CATEGORIES[i] in ("activations", "temporaries") and any(
                a <= info.created < b for a, b in windows):
            i = len(CATEGORIES) + (CATEGORIES[i] == "temporaries")  # HEAD's columns
        sid_cat[sid] = i
    cats = np.array([sid_cat[s] for s in log.sid], dtype=np.int64)
    delta = np.array(log.delta, dtype=np.int64)
    live = np.zeros((n + 1, len(CATEGORIES) + 2), dtype=np.int64)
    np.add.at(live[1:], (np.arange(n), cats), delta)
    live = live.cumsum(axis=0)[start:]  # row 0: live just before the step's first event
    head = live[:, len(CATEGORIES):]
    live = live[:, :len(CATEGORIES)]
    live[:, cat_index["activations"]] += head[:, 0]
    live[:, cat_index["temporaries"]] += head[:, 1]
    phases = np.empty(n - start + 1, dtype=object)
    phases[:] = "start"
    # In the order the phases began (two can begin at the same event: 'start' and 'forward').
    for p, i in log.phase_starts.items():
        if i >= start and p != "start":
            phases[i - start + 1:] = p
    frame = pd.DataFrame(live, columns=list(CATEGORIES))
    frame.insert(0, "phase", phases)
    frame.insert(0, "event", np.arange(len(frame)))
    frame["total"] = live.sum(axis=1)
    for i, name in enumerate(HEAD):
        frame[name] = head[:, i]
    return frame
