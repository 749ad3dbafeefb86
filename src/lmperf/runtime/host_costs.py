"""Host-side costs of an eager training step on the CPU, measured on generic code: the time an
aten op call costs beyond its kernel, in forward and in backward, and the optimizer phase's time
per parameter tensor; and the CPU clock every calibration measurement uses (`best_cpu_s`).

An op inside a real step costs more than a one-element `torch.add` in a loop
(`runtime.ceilings.op_overhead`, ~2.5 us here): module calls, autograd nodes, its output's
allocation, the views around it. So the host time per call is measured on a generic stack of
`HOST_BLOCKS` pre-norm residual MLP blocks (LayerNorm, Linear, GELU, Linear, add; width
`HOST_WIDTH`, 4 tokens: no arithmetic to speak of), per aten call as `workload.op_costs` counts
them. On the project's VM: 9.2 us forward, 5.2 backward, where tiny's and mini's own steps at
batch 1, context 8 took 9-10 us forward and 6-10.5 backward (docs/benchmarks.md, issue 20 runs
8+). The optimizer phase loops over the parameters in Python (clip_grad_norm_, AdamW.step,
zero_grad): its host time is a fixed part plus a part per parameter tensor.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lmperf.runtime import device as dev

REPEATS = 3  # timings per measurement, the fastest kept (calibration's default too)
OPTIMIZER_TENSORS = (8, 64)  # one-element parameters: the optimizer's host time per tensor
HOST_BLOCKS, HOST_WIDTH = 8, 8  # the generic MLP stack timed for the host time per op call


def best_cpu_s(fn, repeats: int) -> float:
    """Seconds of the fastest of `repeats` calls of `fn` on the CPU: CPU time of the calling
    thread when torch runs one intra-op thread (the whole call runs on it; another process
    steals wall time from a long call but not CPU time, so small and large calls are timed
    alike on a shared machine), else wall time (the pool's threads do the work)."""
    clock = dev.PhaseClock(torch.device("cpu"))
    cpu_time = clock.cpu_kind == "thread_time"
    best = float("inf")
    for _ in range(repeats):
        clock.start()
        fn()
        clock.lap("call")
        best = min(best, (clock.cpu_laps if cpu_time else clock.laps)["call"] / 1e3)
    return best


def optimizer_host_cost(counts: tuple[int, int] = OPTIMIZER_TENSORS,
                        repeats: int = REPEATS) -> tuple[float, float]:
    """(fixed seconds, seconds per parameter tensor) of the step's optimizer lines on one-element
    parameters, from the fastest of `repeats` timings at each of the two `counts` (their
    difference per tensor; the fixed part never below 0)."""
    from torch.nn.utils import clip_grad_norm_

    times = []
    for count in counts:
        params = [torch.nn.Parameter(torch.ones(1)) for _ in range(count)]
        optimizer = torch.optim.AdamW(params, lr=1e-4, fused=True)
        scaler = torch.amp.GradScaler("cpu", enabled=False)  # the fp32 regimes' no-op scaler
        grads = [torch.ones(1) for _ in params]

        def phase() -> None:  # workload.steps.train_step's optimizer lines
            clip_grad_norm_(params, 1.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)

        laps = []
        for _ in range(repeats + 1):
            for p, g in zip(params, grads):
                p.grad = g
            laps.append(best_cpu_s(phase, 1))
        times.append(min(laps[1:]))  # the first lap creates AdamW's state: not kept
    per_tensor = max(0.0, (times[1] - times[0]) / (counts[1] - counts[0]))
    return max(0.0, times[0] - counts[0] * per_tensor), per_tensor


class _MlpBlock(torch.nn.Module):
    """A generic pre-norm residual MLP block: x + fc2(gelu(fc1(norm(x))))."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.fc1 = torch.nn.Linear(width, 4 * width)
        self.fc2 = torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))  # (1, 4, width)


class _CallCounter(TorchDispatchMode):
    """Counts aten op calls below autograd, as `workload.op_costs` counts them."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func._schema.name.startswith("prim::"):
            self.calls += 1
        return func(*args, **(kwargs or {}))


def host_op_costs(repeats: int = 10) -> tuple[float, float]:
    """Host seconds per aten op call of an eager forward and of its backward: a stack of
    `HOST_BLOCKS` generic MLP blocks at width `HOST_WIDTH` on 4 tokens (arithmetic nil), the
    fastest of `repeats` CPU times of each phase over its counted calls."""
    model = torch.nn.Sequential(*[_MlpBlock(HOST_WIDTH) for _ in range(HOST_BLOCKS)])
    x = torch.randn(1, 4, HOST_WIDTH)  # (batch, tokens, width)

    def forward() -> torch.Tensor:
        return model(x).square().mean()

    forward().backward()  # warm-up: first calls, gradient buffers
    with _CallCounter() as counted_forward:
        loss = forward()
    with _CallCounter() as counted_backward:
        loss.backward()
    forward_s = backward_s = float("inf")
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        box: list[torch.Tensor] = []
        forward_s = min(forward_s, best_cpu_s(lambda: box.append(forward()), 1))
        backward_s = min(backward_s, best_cpu_s(lambda: box[0].backward(), 1))
    return forward_s / counted_forward.calls, backward_s / counted_backward.calls
