"""Size-aware CPU ceilings: what this CPU attains for an operator of a given size, measured on
a small grid of generic shapes and interpolated per operator.

One square-matmul ceiling and one 64 MiB stream (`runtime.ceilings`) describe large operators.
The operators of a small Transformer are not large: 64- and 128-wide matmuls run at a fraction
of a 1024-square product's FLOP/s, a small elementwise op pays its fixed costs on few bytes,
and softmax, exp and log cost more in arithmetic than in bytes (on one core `torch.exp` takes
~1 ns per element, a copy ~0.2). So the CPU prediction (`questions.bench.predict`) holds each
operator to the ceiling of its own size.

Operands out of the cache ("cold"): inside a training step an op's inputs were written many ops
earlier (backward reads what forward saved) and its output is a block the allocator hands back
cold, so the operands of every measurement below come from the next slice of a `POOL_BYTES`
buffer, larger than the last-level cache (`ColdPool`), never from the previous call's. Measured
on the project's VM (2026-11-25, one thread): the triad at 256 KiB .. 16 MiB ran at 43-60 GB/s
with the same operands at every call and 17-26 GB/s cold; a (64, 64, 64) product at 80 and 56
GFLOP/s, (256, 256, 256) at 89 and 75, (1024, 1024, 1024) at 89 and 91. Ops of a real step ran
at the cold figures or below (docs/benchmarks.md, issue 20 runs 8+).

Calibration, on shapes chosen before looking at any model (none is taken from the operators
being predicted), with lmperf's thread count in force, best of `REPEATS` timings:
- matmul: (m, k) @ (k, n) in fp32 for each of m, k, n in `MATMUL_DIMS` (64 shapes), as
  `torch.bmm` over a batch of `b` such products whose operands fit in `CACHE_BYTES` (small
  products are not dominated by one call's dispatch, which the prediction adds per call);
  calls repeated until one timing lasts `MIN_TIMING_S`. FLOP/s = 2 b m k n / time.
- bandwidth by working set: the STREAM triad z = x + 2 y with x, y, z of ws / 3 bytes each,
  for ws in `WORKING_SETS` (256 KiB .. 64 MiB: L2, L3 and DRAM on the project's machines).
- element rates (elements/s) of operators that compute a transcendental function per element:
  'exp' (`torch.exp`), 'softmax' (`torch.log_softmax` over the last dim), 'softmax_backward'
  (its backward), each on the fp32 shapes of `RATE_SHAPES` (1 and 16 MiB per operand; on one
  core the memory traffic adds to the arithmetic rather than hiding behind it).
  `ELEMENT_RATE_OPS` maps aten ops to them.
- the optimizer's bandwidth: one fused AdamW step on a generic parameter of
  `OPTIMIZER_ELEMENTS` fp32 elements, bytes as `workload.op_costs` counts them (reads parameter,
  gradient and both moments, writes parameter and moments in place: 28 bytes per element). An
  in-place update pays no write-allocate, so it streams faster than the triad, whose fresh
  output is read into the cache before it is written.
- page faults: the bytes of fresh memory a step's outputs fault in (glibc maps a large block
  fresh at every call, and gives a trimmed heap top back to the kernel: which outputs pay is
  `workload.heap_faults`'s replay of the step) cost the time to fill a new `FRESH_PROBE_BYTES`
  tensor minus the time to fill a reused one, per byte (fault and zeroing), and the frees
  that give memory back (trim, unmap) the time to free that tensor, per byte.
- the host time per aten op call in forward and in backward (`runtime.host_costs`): an eager
  forward + backward of a generic stack of `HOST_BLOCKS` pre-norm residual MLP blocks (LayerNorm, Linear, GELU, Linear,
  add) at width `HOST_WIDTH` on 4 tokens, whose arithmetic is nil, over the aten calls it makes
  (counted as `workload.op_costs` counts them). It carries what an op costs inside a step
  beyond the kernel: module calls, autograd nodes, the output's allocation, views. Measured on
  the project's VM: 9.2 us per call forward, 5.2 backward, where a one-element `torch.add` in a
  loop (`runtime.ceilings.op_overhead`) takes 2.5; tiny's and mini's own steps at batch 1,
  context 8 took 9-10 us forward and 6-10.5 backward (docs/benchmarks.md, issue 20 runs 8+).
- the optimizer phase's host time (`runtime.host_costs`): the step's optimizer lines
  (clip_grad_norm_, fused AdamW through a disabled GradScaler, zero_grad) on
  `OPTIMIZER_TENSORS` one-element parameters,
  whose arithmetic is nil: a fixed time plus a time per parameter tensor (Python loops over
  the parameters, per-tensor bookkeeping of the fused kernel), from the two counts' times.
About 1.1-1.5 s on one core at load 0.5-0.8 (2026-11-25: matmul grid 0.6 s, fresh memory
0.25, triad 0.15, element rates 0.1, host costs 0.1), plus ~2 s where it builds the process's
first AdamW (torch imports torch._dynamo then; `--predict cpu` has paid it while counting).

Interpolation: matmul log FLOP/s is trilinear in (log2 m, log2 k, log2 n); bandwidth and element
rates are linear in log2 of the working set (bytes read + written by one call). All are clamped
to the calibrated range: a dimension above 1024 gets the 1024 figure (blocked GEMMs stop gaining
per FLOP there), a working set above 64 MiB the DRAM figure.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from functools import partial

import torch

from lmperf.runtime.host_costs import REPEATS, best_cpu_s, host_op_costs, optimizer_host_cost

MATMUL_DIMS: tuple[int, ...] = (16, 64, 256, 1024)
# From L2 to DRAM on the project's machines; below 256 KiB one call's dispatch (~1 us) would
# weigh on the figure, and the prediction adds that per call already.
WORKING_SETS: tuple[int, ...] = (256 * 2**10, 2**20, 4 * 2**20, 16 * 2**20, 64 * 2**20)
CACHE_BYTES = 2**20  # the batch of small products: operands of at most 1 MiB, as one op's
# (rows, columns) of fp32: 1 MiB (in cache) and 16 MiB (beyond one core's caches). Both stay
# below glibc's largest mmap threshold (32 MiB): an output that large is mapped fresh, page
# faults included, at every call, which would make the second figure a different effect.
RATE_SHAPES: tuple[tuple[int, int], ...] = ((256, 1024), (4096, 1024))
OPTIMIZER_ELEMENTS = 2**22  # 4 Mi fp32 parameters: 112 MiB of AdamW traffic per step, DRAM
FRESH_PROBE_BYTES = 64 * 2**20  # above glibc's largest mmap threshold: mapped fresh each time
# More than the last-level cache of the project's machines (32 MiB L3 on its EPYC VM, up to
# ~100 MiB per socket on server parts would need more; the DRAM figure is then the floor).
POOL_BYTES = 128 * 2**20
MIN_TIMING_S = 1e-3  # one timing at least this long: the clock's and a call's cost stay small
# aten op -> the element rate it is held to (elements of its largest output per second). These
# ops evaluate exp / log / tanh / erf per element (sigmoid and silu via exp; the backward of
# log_softmax recomputes exp(output); softmax's backward is one row reduction and one
# elementwise pass, as log_softmax's). Others are held to the bandwidth of their working set.
ELEMENT_RATE_OPS: dict[str, str] = {
    **{f"aten::{op}": "exp" for op in (
        "exp", "exp_", "log", "log_", "sigmoid", "sigmoid_", "silu", "silu_", "silu_backward",
        "tanh", "tanh_", "gelu", "gelu_backward", "erf", "sin", "cos", "expm1", "log1p")},
    "aten::_softmax": "softmax", "aten::_log_softmax": "softmax",
    "aten::_softmax_backward_data": "softmax_backward",
    "aten::_log_softmax_backward_data": "softmax_backward",
}
METHOD = ("size-aware CPU ceilings, measured now on generic shapes (lmperf.runtime.calibration): "
          "fp32 matmul FLOP/s on (m, k) @ (k, n) for m, k, n in {16, 64, 256, 1024}, "
          "interpolated log-log per op at its (m, k, n); triad bandwidth for working sets "
          "256 KiB .. 64 MiB, interpolated at the op's bytes per call; exp / log_softmax / its "
          "backward elements/s at 1 and 16 MiB for ops that compute exp or log per element; "
          "operands out of the cache (a 128 MiB pool) for all of these; "
          "fused AdamW bytes/s on a 4 Mi-element parameter for the optimizer's ops; the "
          "optimizer phase's host time per parameter tensor (its lines on 8 and 64 one-element "
          "parameters); host time per op call of a generic MLP stack's eager forward and "
          "backward; page faults and unmapping per byte of fresh memory (64 MiB probe) for "
          "the bytes a replay of the step through glibc's heap says it faults in and gives "
          "back; CPU time "
          "of the calling thread, best of 3")


@dataclass(frozen=True)
class Calibration:
    """Size-aware ceilings of one device and thread count.

    matmul: [m, k, n, FLOP/s] per calibrated fp32 shape.
    bandwidth: [working-set bytes, bytes/s (read + written)] per working set.
    element_rates: 'exp' / 'softmax' / 'softmax_backward' -> [working-set bytes, elements per
        second] per calibrated shape.
    optimizer_bytes_per_s: fused AdamW's bytes (read + written) per second.
    fresh_output_s_per_byte: seconds per byte of fresh memory an output faults in, on top of
        writing it (page faults, zeroing).
    give_back_s_per_byte: seconds per byte of memory a free gives back to the kernel (munmap,
        a trimmed heap top).
    optimizer_fixed_s, optimizer_tensor_s: host seconds of the optimizer phase with no
        arithmetic, per step and per parameter tensor (NaN: not measured).
    forward_op_s, backward_op_s: host seconds per aten op call of an eager forward / backward
        (NaN: not measured).
    threads: torch's intra-op threads during the calibration; seconds: how long it took.
    """

    threads: int
    matmul: list[list[float]] = field(default_factory=list)
    bandwidth: list[list[float]] = field(default_factory=list)
    element_rates: dict[str, list[list[float]]] = field(default_factory=dict)
    optimizer_bytes_per_s: float = float("nan")
    fresh_output_s_per_byte: float = 0.0
    give_back_s_per_byte: float = 0.0
    optimizer_fixed_s: float = float("nan")
    optimizer_tensor_s: float = float("nan")
    forward_op_s: float = float("nan")
    backward_op_s: float = float("nan")
    seconds: float = float("nan")

    def to_dict(self) -> dict:
        """The calibration as a record stores it (lists and floats: JSON as is)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Calibration":
        """Back from `to_dict`."""
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    def matmul_flops_per_s(self, m: int, k: int, n: int) -> float:
        """Attained fp32 FLOP/s of an (m, k) @ (k, n) product, interpolated trilinearly in
        log2 of each dimension over the calibrated grid (clamped to its range)."""
        grid = {(int(a), int(b), int(c)): v for a, b, c, v in self.matmul}
        axes = [sorted({key[i] for key in grid}) for i in range(3)]
        corners = [_bracket(axis, x) for axis, x in zip(axes, (m, k, n))]
        log_rate = 0.0
        # 8 corners of the grid cell around (m, k, n); weights of a trilinear interpolation
        for i, (dm, wm) in enumerate(corners[0]):
            for dk, wk in corners[1]:
                for dn, wn in corners[2]:
                    log_rate += wm * wk * wn * math.log(grid[(dm, dk, dn)])
        return math.exp(log_rate)

    def bandwidth_bytes_per_s(self, working_set: float) -> float:
        """Attained bandwidth (bytes/s) for an op touching `working_set` bytes per call,
        linear in log2 of the working set between calibrated points (clamped)."""
        return _by_working_set(self.bandwidth, working_set)

    def fault_s(self, fault_bytes: float) -> float:
        """Seconds to fault in `fault_bytes` of fresh memory (`workload.heap_faults` says
        which outputs do)."""
        return fault_bytes * self.fresh_output_s_per_byte

    def give_back_s(self, nbytes: float) -> float:
        """Seconds to give `nbytes` back to the kernel (`workload.heap_faults` says which
        frees do)."""
        return nbytes * self.give_back_s_per_byte

    def op_host_s(self, phase: str) -> float | None:
        """Host seconds per aten op call in `phase` ('forward', 'backward'); None when not
        measured (or another phase)."""
        value = {"forward": self.forward_op_s, "backward": self.backward_op_s}.get(phase)
        return None if value is None or math.isnan(value) else value

    def optimizer_host_s(self, tensors: int) -> float | None:
        """Host seconds of the optimizer phase for `tensors` parameter tensors, arithmetic
        left out; None when not measured."""
        if math.isnan(self.optimizer_tensor_s):
            return None
        return self.optimizer_fixed_s + tensors * self.optimizer_tensor_s

    def element_rate(self, op: str, working_set: float) -> float | None:
        """Elements per second `op` attains with `working_set` bytes per call where it computes
        a transcendental per element (`ELEMENT_RATE_OPS`); None for every other op."""
        kernel = ELEMENT_RATE_OPS.get(op)
        if kernel is None or kernel not in self.element_rates:
            return None
        return _by_working_set(self.element_rates[kernel], working_set)


def _by_working_set(points: list[list[float]], working_set: float) -> float:
    """The value at `working_set` of [working set, value] points, linear in log2 of the working
    set and in log of the value between them, clamped to their range."""
    table = {int(ws): v for ws, v in points}
    return math.exp(sum(w * math.log(table[ws]) for ws, w in
                        _bracket(sorted(table), max(working_set, 1.0))))


def _bracket(axis: list[int], x: float) -> list[tuple[int, float]]:
    """The two grid points around `x` on a sorted `axis` with their weights, linear in log2 x
    (one point with weight 1 when x lies outside the axis or on a point)."""
    if x <= axis[0]:
        return [(axis[0], 1.0)]
    if x >= axis[-1]:
        return [(axis[-1], 1.0)]
    hi = next(i for i, a in enumerate(axis) if a >= x)
    lo_v, hi_v = axis[hi - 1], axis[hi]
    w = (math.log2(x) - math.log2(lo_v)) / (math.log2(hi_v) - math.log2(lo_v))
    return [(lo_v, 1.0 - w), (hi_v, w)]


def _timed_rate(fn, work: float, repeats: int) -> float:
    """`work` units per second of `fn`, calls repeated so that one timing lasts at least
    `MIN_TIMING_S`; best of `repeats` timings. `fn` may be a list of calls doing the same
    work on different operands (a `ColdPool`'s): the calls cycle through it, never restarting,
    so that each call's operands were last touched a whole pool ago."""
    fns = fn if isinstance(fn, list) else [fn]
    turn = [0]

    def one() -> None:
        fns[turn[0] % len(fns)]()
        turn[0] += 1

    single = best_cpu_s(one, 1)  # also the warm-up: first touch, kernel selection
    calls = max(1, math.ceil(MIN_TIMING_S / max(single, 1e-9)))

    def run() -> None:
        for _ in range(calls):
            one()

    return work * calls / best_cpu_s(run, repeats)


class ColdPool:
    """One fp32 buffer of `nbytes` (default `POOL_BYTES`, more than the last-level cache) cut
    into disjoint slices: a measurement that takes each call's operands from the next slice
    finds them out of the cache, as an op of a training step does (see the module)."""

    def __init__(self, nbytes: int | None = None):
        self.buffer = torch.ones((nbytes or POOL_BYTES) // 4)  # written once: no page faults

    def slices(self, nbytes: int) -> list[torch.Tensor]:
        """Disjoint 1-D fp32 views of `nbytes` each (at least one; fresh memory when one
        slice does not fit the pool)."""
        n = max(1, nbytes // 4)
        count = self.buffer.numel() // n
        if count == 0:
            return [torch.ones(n)]
        return [self.buffer[i * n:(i + 1) * n] for i in range(count)]


def _split(flat: torch.Tensor, *shapes: tuple[int, ...]) -> list[torch.Tensor]:
    """Consecutive views of `flat` with the given shapes."""
    out, start = [], 0
    for shape in shapes:
        size = math.prod(shape)
        out.append(flat[start:start + size].view(shape))
        start += size
    return out


def matmul_rate(m: int, k: int, n: int, repeats: int = REPEATS,
                pool: ColdPool | None = None) -> float:
    """Attained fp32 FLOP/s of (m, k) @ (k, n) on the CPU, as a batch of products whose
    operands fit in `CACHE_BYTES` (`torch.bmm`: one dispatch for the batch); operands and
    output from `pool` (out of the cache), or the same ones at every call when None."""
    batch = max(1, CACHE_BYTES // (4 * (m * k + k * n + m * n)))
    shapes = ((batch, m, k), (batch, k, n), (batch, m, n))  # a, b, out
    flats = ([torch.ones(sum(math.prod(s) for s in shapes))] if pool is None
             else pool.slices(4 * sum(math.prod(s) for s in shapes)))
    calls = []
    for flat in flats:
        a, b, out = _split(flat, *shapes)
        calls.append(lambda a=a, b=b, out=out: torch.bmm(a, b, out=out))
    return _timed_rate(calls, 2.0 * batch * m * k * n, repeats)


def triad_bandwidth(working_set: int, repeats: int = REPEATS,
                    pool: ColdPool | None = None) -> float:
    """Attained bytes/s (read + written) of z = x + 2 y over `working_set` bytes in all,
    operands from `pool` (out of the cache) or the same ones at every call when None."""
    n = max(1, working_set // 12)  # three fp32 buffers of n elements
    flats = [torch.ones(3 * n)] if pool is None else pool.slices(12 * n)
    calls = []
    for flat in flats:
        x, y, z = _split(flat, (n,), (n,), (n,))
        calls.append(lambda x=x, y=y, z=z: torch.add(x, y, alpha=2.0, out=z))
    return _timed_rate(calls, 12.0 * n, repeats)


def element_rates(repeats: int = REPEATS, shapes: tuple[tuple[int, int], ...] | None = None,
                  pool: ColdPool | None = None) -> dict[str, list[list[float]]]:
    """[working-set bytes, elements per second] of exp, log_softmax and log_softmax's backward
    on each of `shapes` (default `RATE_SHAPES`; the working set: fp32 bytes read + written by
    one call), inputs and outputs from `pool` (out of the cache) or the same ones when None.
    Inputs are ones (finite: a masked score's -inf is slower, see the module)."""
    rates: dict[str, list[list[float]]] = {"exp": [], "softmax": [], "softmax_backward": []}
    if pool is not None:
        # earlier measurements left products in the pool (up to inf): exp of an overflowing or
        # infinite input takes a slow path (3.2 ns per element measured, against 1.0)
        pool.buffer.fill_(1.0)
    for shape in shapes or RATE_SHAPES:
        n = math.prod(shape)
        flats = [torch.ones(4 * n)] if pool is None else pool.slices(16 * n)
        exp, softmax, backward = [], [], []
        for flat in flats:
            x, y, grad, out = _split(flat, shape, shape, shape, shape)  # (rows, columns) each
            exp.append(lambda x=x, out=out: torch.exp(x, out=out))
            softmax.append(lambda x=x, y=y: torch._log_softmax(x, -1, False, out=y))
            backward.append(lambda grad=grad, y=y, out=out: torch._log_softmax_backward_data(
                grad, y, -1, torch.float32, out=out))
        rates["exp"].append([8 * n, _timed_rate(exp, n, repeats)])
        rates["softmax"].append([8 * n, _timed_rate(softmax, n, repeats)])
        rates["softmax_backward"].append([12 * n, _timed_rate(backward, n, repeats)])
    return rates


def optimizer_bandwidth(elements: int | None = None, repeats: int = REPEATS) -> float:
    """Bytes per second of one fused AdamW step on a parameter of `elements` fp32 elements
    (default `OPTIMIZER_ELEMENTS`; 28 bytes per element: parameter, gradient and two moments
    read; three written)."""
    elements = elements or OPTIMIZER_ELEMENTS
    param = torch.nn.Parameter(torch.rand(elements))
    param.grad = torch.rand(elements)
    optimizer = torch.optim.AdamW([param], lr=1e-4, fused=True)
    optimizer.step()  # creates the moments (first touch), as a run's first step does
    return _timed_rate(optimizer.step, 28.0 * elements, repeats)


def fresh_memory_cost(nbytes: int | None = None, repeats: int = REPEATS) -> tuple[float, float]:
    """(seconds per byte of filling a freshly mapped fp32 tensor of `nbytes` (default
    `FRESH_PROBE_BYTES`, mapped by glibc at every allocation) beyond filling a reused one,
    never negative; seconds per byte of freeing it: the unmap), fastest of `repeats` each."""
    n = (nbytes or FRESH_PROBE_BYTES) // 4
    reused = torch.empty(n)
    reused.fill_(0.0)  # first touch
    fill_s = best_cpu_s(partial(reused.fill_, 1.0), repeats)
    del reused  # its 64 MiB go back to the kernel before the fresh ones are timed
    held: list[torch.Tensor] = []
    fresh_s = free_s = float("inf")
    for _ in range(repeats):
        fresh_s = min(fresh_s, best_cpu_s(lambda: held.append(torch.empty(n).fill_(1.0)), 1))
        free_s = min(free_s, best_cpu_s(held.clear, 1))  # the last reference: munmap
    return max(0.0, (fresh_s - fill_s) / (4 * n)), free_s / (4 * n)


def calibrate(repeats: int = REPEATS, dims: tuple[int, ...] = MATMUL_DIMS,
              working_sets: tuple[int, ...] = WORKING_SETS) -> Calibration:
    """Measure the size-aware ceilings of this CPU with the thread count in force: the matmul
    grid over `dims`, the triad over `working_sets` and the element rates (see the module)."""
    import time

    start = time.perf_counter()
    with torch.no_grad():
        pool = ColdPool()
        matmul = [[m, k, n, matmul_rate(m, k, n, repeats, pool)]
                  for m in dims for k in dims for n in dims]
        bandwidth = [[ws, triad_bandwidth(ws, repeats, pool)] for ws in working_sets]
        rates = element_rates(repeats, pool=pool)
        del pool
        optimizer = optimizer_bandwidth(repeats=repeats)
        fresh, give_back = fresh_memory_cost(repeats=repeats)
    fixed, per_tensor = optimizer_host_cost(repeats=repeats)  # clip_grad_norm_ needs grad mode
    forward_op, backward_op = host_op_costs()  # autograd on
    return Calibration(threads=torch.get_num_threads(), matmul=matmul, bandwidth=bandwidth,
                       element_rates=rates, optimizer_bytes_per_s=optimizer,
                       fresh_output_s_per_byte=fresh, give_back_s_per_byte=give_back,
                       optimizer_fixed_s=fixed,
                       optimizer_tensor_s=per_tensor, forward_op_s=forward_op,
                       backward_op_s=backward_op,
                       seconds=time.perf_counter() - start)
