"""What each operator of a step must do: FLOPs and bytes per aten op and phase, counted on fake
tensors (shapes and dtypes, no data: nothing is allocated and no arithmetic runs).

The step is THE training step (`workload.steps`), driven by an observer that tells the counter
which phase it is in, so forward, backward and optimizer ops are told apart exactly as the
clocks and the profiler tell them apart. The model is built on the meta device and moved to
`FakeTensorMode` CPU tensors (meta tensors have no autocast: fake CPU tensors do, so a
bf16-mixed step counts its matmuls in bf16, as it runs them).

Per op call (a `TorchDispatchMode`, so below autograd: the backward's ops are seen one by one,
and composite ops such as `linear` arrive as the `mm` / `addmm` they decompose into):
- FLOPs: `torch.utils.flop_counter.FlopCounterMode`'s formulas (matmuls, attention kernels,
  convolutions; elementwise ops count 0), as the counter's total before and after the call.
- bytes: every distinct input tensor read once, plus every output that is not an input, plus
  every input the op's schema marks as written (`Tensor(a!)`: in-place and optimizer updates
  read and write their operand). View ops (`t`, `view`, `transpose`, `detach`...) move nothing:
  0 bytes. A broadcast input counts its storage, not its expanded size.
These are the bytes an operator must move at the least (each operand once); a kernel that
re-reads a tile from memory moves more, which the roofline ratio then shows.
- size: a matrix product's (m, k, n) (`(m, k) @ (k, n)`, per matrix of a batched product) and
  every op's elements (its largest output's, summed over calls). Rows are kept apart by the
  product's shape and by the bytes one call moves (bytes / calls of a row is one call's), so a
  size-aware ceiling (the CPU prediction's) can hold each row to the ceiling of its own size.
- page faults: each fresh storage's allocation and (through a weak reference) its free are
  logged, in step order, with the first uncounted step's; `workload.heap_faults` replays them
  through a model of glibc's heap and charges each row the bytes its outputs fault in. Where
  the C library is not glibc the model does not apply: no faults are charged, and `method`
  says so.
"""

from __future__ import annotations

import time
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from typing import NamedTuple

import pandas as pd
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode

# aten ops whose FLOPs are a matrix product (the "matmul" class of a roofline or a prediction)
MATMUL_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul",
                        "aten::linear", "aten::_addmm_activation", "aten::addbmm"})
# Ops that alias their input without saying so in their schema (moves nothing either).
VIEW_OPS = frozenset({"aten::_unsafe_view", "aten::alias", "aten::lift_fresh"})
CLASSES: tuple[str, ...] = ("matmul", "attention", "elementwise/norm", "optimizer")
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
               torch.float64: "fp64"}
_Rows = dict[tuple, list[int]]  # (phase, op, dtype, m, k, n, bytes per call) -> VALUES
COLUMNS = ["phase", "op", "dtype", "op_class", "m", "k", "n", "calls", "flops", "bytes_read",
           "bytes_written", "elements", "fault_bytes"]
# A row's key: (phase, op, dtype, m, k, n, bytes per call); its values VALUES, summed over calls.
VALUES: tuple[str, ...] = ("calls", "flops", "bytes_read", "bytes_written", "elements",
                           "fault_bytes")


def op_class(op: str, phase: str) -> str:
    """The class of an aten op for attainable fractions: every optimizer-phase op is
    'optimizer'; scaled-dot-product / flash kernels 'attention'; matrix products 'matmul';
    the rest (elementwise, norms, reductions, copies) 'elementwise/norm'."""
    if phase == "optimizer":
        return "optimizer"
    if "scaled_dot_product" in op or "flash_attention" in op or "efficient_attention" in op:
        return "attention"
    return "matmul" if op in MATMUL_OPS else "elementwise/norm"


def _nbytes(t: torch.Tensor) -> int:
    """Bytes a kernel must touch for `t`: its elements, or its storage when smaller (a
    broadcast / expanded view reads its storage once)."""
    size = t.numel() * t.element_size()
    try:
        return min(size, t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):  # a tensor subclass without storage
        return size


def _storage(t: torch.Tensor) -> torch.UntypedStorage | None:
    """`t`'s storage; None for a layout without one (a sparse gradient, a nested tensor): the
    heap replay leaves those out."""
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None


def _matmul_shape(name: str, args: tuple) -> tuple[int, int, int]:
    """(m, k, n) of a matrix product's `(m, k) @ (k, n)` (per matrix when batched): its last two
    tensor arguments are the operands (`mm(a, b)`, `addmm(bias, a, b)`, `bmm`, `baddbmm`);
    (0, 0, 0) for any other op."""
    if name not in MATMUL_OPS:
        return (0, 0, 0)
    mats = [t for t in args if isinstance(t, torch.Tensor) and t.dim() >= 2]
    if len(mats) < 2:
        return (0, 0, 0)
    a, b = mats[-2], mats[-1]  # (..., m, k), (..., k, n)
    return (int(a.shape[-2]), int(a.shape[-1]), int(b.shape[-1]))


def _written_inputs(func, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The input tensors the op's schema marks as written (`Tensor(a!)`, `Tensor(a!)[]`)."""
    out = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = args[i] if i < len(args) else kwargs.get(arg.name)
        out += [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]
    return out


class _CostMode(TorchDispatchMode):
    """Adds each op call's FLOPs, bytes and elements to rows keyed by (phase, op, dtype, m, k,
    n, bytes per call)."""

    def __init__(self, flops: FlopCounterMode, events: list | None = None,
                 storages: weakref.WeakKeyDictionary | None = None):
        super().__init__()
        self.flops = flops
        self.phase = "forward"
        self.rows: _Rows = defaultdict(lambda: [0] * len(VALUES))
        # storage -> id, and the (id, bytes, row key) / (id, 0, None) events of the fresh
        # storages the step allocates and frees (`workload.heap_faults`), shared with the
        # first step's mode: one order, one id per storage
        self.storages = weakref.WeakKeyDictionary() if storages is None else storages
        self.events: list = [] if events is None else events

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        before = self.flops.get_total_flops()
        out = func(*args, **kwargs)
        name = func._schema.name
        if name.startswith("prim::"):  # device / layout queries, not operators
            return out
        inputs = {id(t): t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        read = written = 0
        if not (func.is_view or name in VIEW_OPS):
            read = sum(_nbytes(t) for t in inputs.values())
            fresh = {id(t): t for t in outputs if id(t) not in inputs}
            fresh |= {id(t): t for t in _written_inputs(func, args, kwargs)}
            written = sum(_nbytes(t) for t in fresh.values())
        first = next((t for t in list(inputs.values()) + outputs if t.is_floating_point()), None)
        dtype = DTYPE_NAMES.get(first.dtype, str(first.dtype)) if first is not None else "-"
        elements = max((t.numel() for t in outputs), default=0)
        # Calls of different sizes stay apart, except in the optimizer: its ops take every
        # parameter at once (fused / foreach lists), so their size grows with the layers, which
        # the extrapolation over layers must see as one row.
        per_call = 0 if self.phase == "optimizer" else read + written
        key = (self.phase, name, dtype, *_matmul_shape(name, args), per_call)
        row = self.rows[key]
        for i, value in enumerate((1, self.flops.get_total_flops() - before, read, written,
                                   elements)):
            row[i] += value
        if not (func.is_view or name in VIEW_OPS):
            self._log_fresh(outputs, inputs.values(), key)
        return out

    def _log_fresh(self, outputs: list, inputs, key: tuple) -> None:
        """Log the storages among `outputs` that are new (neither an input's nor seen before),
        and, through a weak reference, the moment each is freed (CPython frees it when its
        last tensor dies, in step order)."""
        known = {id(_storage(t)) for t in inputs}
        for t in outputs:
            storage = _storage(t)
            if storage is None or id(storage) in known or storage in self.storages:
                continue
            sid = self.storages[storage] = len(self.events)  # unique: one event per alloc
            self.events.append((sid, int(storage.nbytes()), key))
            weakref.finalize(storage, self._freed, sid).atexit = False

    def _freed(self, sid: int) -> None:
        self.events.append((sid, -1, self.phase))


class _PhaseObserver:
    """The step's observer: moves the counter to the next phase at each lap."""

    def __init__(self, mode: _CostMode, phases: tuple[str, ...]):
        self.mode, self.phases, self.index = mode, phases, 0

    def start(self) -> None:
        self.index = 0
        self.mode.phase = self.phases[0]

    def lap(self, phase: str) -> None:
        self.index = min(self.index + 1, len(self.phases) - 1)
        self.mode.phase = self.phases[self.index]


class _Count(NamedTuple):
    rows: _Rows
    params: int
    returned: dict
    heap: str  # how page faults were counted, for the method


@dataclass(frozen=True)
class OpCosts:
    """Per-op costs of one step: `table` has COLUMNS (FLOPs, bytes and elements per step,
    summed over the op's calls of one size in that phase and dtype; m, k, n: a matrix
    product's shape, 0 for other ops); method says how they were counted; count_s is how long
    counting took (seconds); param_tensors: the model's parameter tensors (0: not counted);
    returned_bytes: phase -> bytes its frees give back to the kernel per step (heap trims,
    unmaps: `workload.heap_faults`; the two-layer step's when extrapolated); fault_method: how
    `fault_bytes` and `returned_bytes` were counted (or why they are 0: not glibc)."""

    table: pd.DataFrame
    method: str
    count_s: float
    param_tensors: int = 0
    returned_bytes: dict = field(default_factory=dict)
    fault_method: str = ""

    def by_phase(self) -> pd.DataFrame:
        """FLOPs, bytes and calls per phase (one step)."""
        return self.table.groupby("phase", sort=False)[
            ["calls", "flops", "bytes_read", "bytes_written"]].sum().reset_index()


def count_op_costs(spec, precision: str | None = None) -> OpCosts:
    """FLOPs and bytes per (phase, aten op, dtype) of one step of `spec` (a RunSpec: its model,
    shape, context, batch, mode, optimizer and precision, or `precision` instead), counted on
    fake CPU tensors after one uncounted step (AdamW creates its state in the first step, which
    measured steps never do). Loss scaling is left out (its few elementwise ops would need the
    data to decide whether to skip the step). Raises what the model raises on fake tensors.

    The reference LM's blocks are identical, so every count is exactly linear in the number of
    layers L: it is counted at L = 1 and L = 2 and extrapolated (count(1) + (L - 1) x
    (count(2) - count(1))), which takes seconds where counting `medium` whole would take a
    minute (fake tensors cost ~1 ms per op). A user's model is counted whole. The exception is
    `fault_bytes` (bytes of fresh heap or mapped memory an op's outputs fault in per step, from
    replaying the step's storage events through `workload.heap_faults`): it is the two-layer
    step's, not extrapolated.
    """
    from dataclasses import replace

    start = time.perf_counter()
    layers = spec.num_layers
    if spec.model is None and layers > 2:
        c1, c2 = (_count(replace(spec, num_layers=n), precision) for n in (1, 2))
        one, two, returned, heap = c1.rows, c2.rows, c2.returned, c2.heap
        params = c1.params + (layers - 1) * (c2.params - c1.params)
        zero = [0] * len(VALUES)
        # Page faults are not linear in depth (a hole one layer leaves is reused by the next):
        # the two-layer step's are kept as they are (`workload.heap_faults`).
        linear = [name != "fault_bytes" for name in VALUES]
        rows = {k: [a + (layers - 1) * (b - a) if lin else b for a, b, lin in zip(
                    one.get(k, zero), two.get(k, zero), linear)]
                for k in dict.fromkeys(list(one) + list(two))}
        method = (f"counted at 1 and 2 layers on fake tensors, extrapolated linearly to "
                  f"{layers} (page faults: the 2-layer step's)")
    else:
        rows, params, returned, heap = _count(spec, precision)
        method = "counted on fake tensors"
    table = pd.DataFrame([{"phase": phase, "op": op, "dtype": dtype,
                           "op_class": op_class(op, phase), "m": m, "k": k, "n": n,
                           **dict(zip(VALUES, values))}
                          for (phase, op, dtype, m, k, n, _), values in rows.items()
                          if phase != "after"], columns=COLUMNS)
    returned = {phase: n for phase, n in returned.items() if phase in set(table["phase"])}
    return OpCosts(table, method, time.perf_counter() - start, params, returned, heap)


def _count(spec, precision: str | None) -> "_Count":
    """(phase, op, dtype, m, k, n, bytes per call) -> VALUES of one step of `spec`, the
    model's number of parameter tensors and the bytes each phase gives back to the kernel."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from lmperf.model.custom import build_model
    from lmperf.runtime.precision import autocast, get_regime
    from lmperf.workload.build import OPTIMIZER_FLAGS
    from lmperf.workload.heap_faults import Faults, glibc_version, replay
    from lmperf.workload.steps import NO_OBSERVER, PHASES, STEPS, StepState

    regime = get_regime(precision or spec.precision)
    cpu = torch.device("cpu")
    with torch.device("meta"):  # shapes only; outside the fake mode (it keeps weak references)
        model = build_model(spec.model_config(), spec.model).to(dtype=regime.param_dtype)
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = model.to_empty(device=cpu)
        tokens = torch.zeros((spec.batch, spec.context), dtype=torch.long,
                             device=cpu)  # (B, T)
        optimizer = None
        if spec.mode == "train-step":
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4,
                                          **OPTIMIZER_FLAGS.get(spec.optimizer, {}))
        state = StepState(model, tokens, tokens, lambda: autocast(regime, cpu),
                          torch.amp.GradScaler("cpu", enabled=False), optimizer,
                          clip=spec.clip_norm())
        step = STEPS[spec.mode]
        # The first step is not counted (AdamW creates its state in it, which measured steps
        # never do) but its storages are logged: the moments it leaves in the heap shape where
        # later steps' activations go (`workload.heap_faults`).
        first = _CostMode(FlopCounterMode(display=False))
        with first:
            step(state, NO_OBSERVER)
        mark = len(first.events)
        with FlopCounterMode(display=False) as flops, \
                _CostMode(flops, first.events, first.storages) as mode:
            step(state, _PhaseObserver(mode, PHASES[spec.mode] + ("after",)))
    column = VALUES.index("fault_bytes")
    glibc = glibc_version()
    if glibc is None:  # another C library's heap: the replay would be glibc's, not this one's
        faults, heap = Faults({}, {}), "not modelled (the C library is not glibc)"
    else:
        # the step's output is freed by now; a free of a first-step storage seen during the
        # counted step (none in lmperf's steps) belongs to neither replay
        faults = replay(mode.events[mark:], mode.events[:mark])
        heap = f"the step replayed through glibc {glibc}'s heap (workload.heap_faults)"
    for key, nbytes in faults.faulted.items():
        mode.rows[key][column] += nbytes
    return _Count(dict(mode.rows), sum(1 for _ in model.parameters()), faults.returned, heap)
