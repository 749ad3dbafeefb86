"""What each operator of a step must do: FLOPs and bytes per aten op and phase, and the order the
host issues the ops in, counted on fake tensors (nothing allocated, no arithmetic). The
conventions: docs/commands/plan.md, "The op counts"."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
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
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
               torch.float64: "fp64"}
COLUMNS = ["phase", "op", "dtype", "op_class", "calls", "flops", "bytes_read", "bytes_written"]
# A row's key: (phase, op, dtype, bytes per call); its values VALUES, summed over calls.
VALUES: tuple[str, ...] = ("calls", "flops", "bytes_read", "bytes_written")
_CPU_SDPA = "aten::_scaled_dot_product_flash_attention_for_cpu"
# The kernel CUDA runs for SDPA in each dtype (torch's priority: flash needs fp16 / bf16, the
# memory-efficient kernel takes fp32), as a CUDA trace names the op.
_CUDA_SDPA = {"bf16": "aten::_scaled_dot_product_flash_attention",
              "fp16": "aten::_scaled_dot_product_flash_attention"}
_CUDA_SDPA_FP32 = "aten::_scaled_dot_product_efficient_attention"


def op_class(op: str, phase: str) -> str:
    """The class of an aten op for attainable fractions: every optimizer-phase op is
    'optimizer'; scaled-dot-product / flash kernels 'attention'; matrix products 'matmul';
    the rest (elementwise, norms, reductions, copies) 'elementwise/norm'."""
    if phase == "optimizer":
        return "optimizer"
    if "scaled_dot_product" in op or "flash_attention" in op or "efficient_attention" in op:
        return "attention"
    return "matmul" if op in MATMUL_OPS else "elementwise/norm"


def cuda_op_name(op: str, dtype: str) -> str:
    """The name a CUDA trace gives the op the CPU ran as `op` (CPU flash attention -> flash
    attention in fp16 / bf16, memory-efficient attention in fp32; the rest unchanged)."""
    if not op.startswith(_CPU_SDPA):
        return op
    return _CUDA_SDPA.get(dtype, _CUDA_SDPA_FP32) + op[len(_CPU_SDPA):]


def _attention_flops(query_shape, key_shape, value_shape, *args, **kwargs) -> int:
    """A fused attention's forward as the naive kernel computes it: Q K^T and P V over the
    full square, 2 FLOPs per multiply-add. Shapes (B, H, T_q, d), (B, H_kv, T_k, d), (.., d_v)."""
    b, h, t_q, d = query_shape
    return 2 * b * h * t_q * key_shape[-2] * (d + value_shape[-1])


def _attention_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args,
                              **kwargs) -> int:
    """Its backward as the naive kernel's four products: twice the forward."""
    return 2 * _attention_flops(query_shape, key_shape, value_shape)


def _custom_flops() -> dict:
    """FLOP formulas torch's counter lacks (the CPU's fused attention), for FlopCounterMode."""
    aten = torch.ops.aten
    out = {}
    for name, formula in (("_scaled_dot_product_flash_attention_for_cpu", _attention_flops),
                          ("_scaled_dot_product_flash_attention_for_cpu_backward",
                           _attention_backward_flops)):
        if hasattr(aten, name):
            out[getattr(aten, name)] = formula
    return out


def _nbytes(t: torch.Tensor) -> int:
    """Bytes a kernel must touch for `t`: its elements, or its storage when smaller (a
    broadcast / expanded view reads its storage once)."""
    size = t.numel() * t.element_size()
    try:
        return min(size, t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):  # a tensor subclass without storage
        return size


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
    """Adds each op call's FLOPs and bytes to rows keyed by (phase, op, dtype, bytes per call),
    and appends the row's key to the phase's issue order."""

    def __init__(self, flops: FlopCounterMode):
        super().__init__()
        self.flops = flops
        self.phase = "forward"
        self.rows: dict[tuple, list[int]] = defaultdict(lambda: [0] * len(VALUES))
        self.order: dict[str, list[tuple]] = defaultdict(list)

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
        # Calls of different sizes stay apart, except in the optimizer: its ops take every
        # parameter at once (fused / foreach lists), so their size grows with the layers, which
        # the extrapolation over layers must see as one row.
        key = (self.phase, name, dtype, 0 if self.phase == "optimizer" else read + written)
        row = self.rows[key]
        for i, value in enumerate((1, self.flops.get_total_flops() - before, read, written)):
            row[i] += value
        self.order[self.phase].append(key)
        return out


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


@dataclass(frozen=True)
class OpCosts:
    """Per-op costs of one step: `table` has COLUMNS (FLOPs and bytes per step, summed over the
    op's calls of one size in that phase and dtype); `order`: phase -> the table's row index of
    each call, in issue order; method says how they were counted; count_s is how long counting
    took (seconds); param_tensors: the model's parameter tensors (0: not counted)."""

    table: pd.DataFrame
    method: str
    count_s: float
    param_tensors: int = 0
    order: dict[str, list[int]] = field(default_factory=dict)


def count_op_costs(spec, precision: str | None = None) -> OpCosts:
    """FLOPs and bytes per (phase, aten op, dtype) of one step of `spec` (a RunSpec; `precision`
    replaces its own; a CUDA device counts under CUDA's autocast lists and op names), counted on
    fake CPU tensors with AdamW's state created first, loss scaling left out. The reference LM
    is counted at 1 and 2 layers and extrapolated (docs/commands/plan.md, "The op counts"); a
    user's model whole; each count is cached for the process (a plan asks for the 1- and
    2-layer models again to price pipeline stages). Raises what the model raises on fake
    tensors."""
    from dataclasses import replace

    start = time.perf_counter()
    layers = spec.num_layers
    if spec.model is None and layers > 2:
        (one, order1, params1), (two, order2, params2) = (
            _count(replace(spec, num_layers=n), precision) for n in (1, 2))
        params = params1 + (layers - 1) * (params2 - params1)
        zero = [0] * len(VALUES)
        rows = {k: [a + (layers - 1) * (b - a) for a, b in zip(one.get(k, zero), two.get(k, zero))]
                for k in dict.fromkeys(list(one) + list(two))}
        order = {p: seq for p in order2
                 if (seq := _repeat(order1.get(p, []), order2[p], layers)) is not None}
        method = f"counted at 1 and 2 layers on fake tensors, extrapolated linearly to {layers}"
    else:
        rows, order, params = _count(spec, precision)
        method = "counted on fake tensors"
    cuda = getattr(spec, "device", "cpu") == "cuda"
    keys = [k for k in rows if k[0] != "after" and any(rows[k])]
    table = pd.DataFrame([{"phase": phase, "dtype": dtype,
                           "op": cuda_op_name(op, dtype) if cuda else op,
                           "op_class": op_class(op, phase), **dict(zip(VALUES, rows[key]))}
                          for key in keys for phase, op, dtype, _ in [key]], columns=COLUMNS)
    index = {k: i for i, k in enumerate(keys)}
    order = {p: [index[k] for k in seq if k in index] for p, seq in order.items() if p != "after"}
    return OpCosts(table, method, time.perf_counter() - start, params, order)


def at_batch(one: OpCosts, two: OpCosts, batch: int) -> OpCosts | None:
    """The costs of micro-batch `batch` read off those of micro-batches 1 and 2 (`one`, `two`):
    the step runs the same ops in the same order at every batch and each call's FLOPs and bytes
    are fixed or proportional to it, so call i costs c1_i + (batch - 1) (c2_i - c1_i). None when
    the two orders do not line up call by call (count that batch instead)."""
    t1, t2 = one.table, two.table
    c1, c2 = (t[list(VALUES)].to_numpy(dtype=float) for t in (t1, t2))
    p1, p2 = c1[:, 1:] / c1[:, :1], c2[:, 1:] / c2[:, :1]  # per call
    ops1, ops2 = t1["op"].to_numpy(), t2["op"].to_numpy()
    pairs: dict[tuple[int, int], int] = {}
    order: dict[str, list[int]] = {}
    for phase, seq in one.order.items():
        other = two.order.get(phase, [])
        if len(other) != len(seq) or len(seq) != int(c1[t1["phase"] == phase, 0].sum()):
            return None
        order[phase] = [pairs.setdefault((a, b), len(pairs)) for a, b in zip(seq, other)]
    if len(order) != t1["phase"].nunique() or any(ops1[a] != ops2[b] for a, b in pairs):
        return None
    calls = np.bincount(np.concatenate([np.asarray(o) for o in order.values()]),
                        minlength=len(pairs))
    first, second = (np.array(x) for x in zip(*pairs)) if pairs else ([], [])
    values = calls[:, None] * (p1[first] + (batch - 1) * (p2[second] - p1[first]))
    table = t1.iloc[first][["phase", "op", "dtype", "op_class"]].reset_index(drop=True)
    table["calls"] = calls
    for i, name in enumerate(VALUES[1:]):
        table[name] = np.rint(values[:, i]).astype(np.int64)
    return OpCosts(table[COLUMNS], f"{one.method}; micro-batch {batch} read off 1 and 2", 0.0,
                   one.param_tensors, order)


def _repeat(one: list, two: list, layers: int) -> list | None:
    """The issue order of `layers` identical blocks from the orders at 1 and 2 layers: `two` is
    `one` with one block's calls inserted (prefix + block + suffix, prefix + suffix = `one`),
    so L layers are prefix + block x (L - 1) + suffix. None when `two` is not `one` with one
    block inserted (an optimizer that loops op by op over every parameter): no order then."""
    p = 0
    while p < len(one) and one[p] == two[p]:
        p += 1
    s = 0
    while s < len(one) - p and one[-1 - s] == two[-1 - s]:
        s += 1
    if p + s != len(one):
        return None
    block = two[p:len(two) - s]
    return two[:p] + block * (layers - 1) + two[len(two) - s:]


@contextlib.contextmanager
def _foreach_on_fake():
    """Let fake tensors take the foreach paths real tensors take: torch chooses foreach (in
    `clip_grad_norm_`, and the optimizers' defaults) only for types in a private list of plain
    tensor types, so a fake step would clip one parameter at a time, which no real run does
    (`small`: 223 optimizer-phase ops instead of ~20). Feature-detected; restored after."""
    try:
        from torch._subclasses.fake_tensor import FakeTensor
        from torch.utils import _foreach_utils

        types = _foreach_utils._foreach_supported_types
    except (ImportError, AttributeError):
        yield
        return
    types.append(FakeTensor)
    try:
        yield
    finally:
        types.remove(FakeTensor)


@lru_cache(maxsize=128)
def _count(spec, precision: str | None) -> tuple[dict, dict, int]:
    """(phase, op, dtype, bytes per call) -> VALUES of one step of `spec`, each phase's issue
    order of those keys, and the model's number of parameter tensors (read, never changed, by
    the callers: the result is cached)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from lmperf.model.custom import build_model
    from lmperf.runtime.cuda_autocast import cuda_fp32_ops
    from lmperf.runtime.precision import autocast, get_regime
    from lmperf.workload.build import OPTIMIZER_FLAGS
    from lmperf.workload.steps import PHASES, STEPS, StepState

    regime = get_regime(precision or spec.precision)
    cpu = torch.device("cpu")
    # CUDA's autocast runs more ops in fp32 than the CPU's: emulated for a CUDA spec
    lists = cuda_fp32_ops if getattr(spec, "device", "cpu") == "cuda" else contextlib.nullcontext
    with torch.device("meta"):  # shapes only; outside the fake mode (it keeps weak references)
        model = build_model(spec.model_config(), spec.model).to(dtype=regime.param_dtype)
    with FakeTensorMode(allow_non_fake_inputs=True), lists(), _foreach_on_fake():
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
        if optimizer is not None:  # AdamW's state, as a first step leaves it: not counted
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        with FlopCounterMode(display=False, custom_mapping=_custom_flops()) as flops, \
                _CostMode(flops) as mode:
            step(state, _PhaseObserver(mode, PHASES[spec.mode] + ("after",)))
    return dict(mode.rows), dict(mode.order), sum(1 for _ in model.parameters())
