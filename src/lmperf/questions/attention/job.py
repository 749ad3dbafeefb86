"""One attention configuration in this process, as a record: three timed passes (forward;
backward of one retained graph; forward + backward), then one untimed pass that accounts for the
memory left for backward (one kind of measurement per pass). The timer is in `time_calls`."""

from __future__ import annotations

from typing import Callable

import torch

from lmperf import kernels
from lmperf.kernels import flash_configs
from lmperf.questions.attention.spec import AttnSpec
from lmperf.units import MIB
from lmperf.core.envelope import Run, measured
from lmperf.core.outcome import Stage
from lmperf.measure.stats import spread_warning, summarize
from lmperf.runtime import device as dev

KIND = AttnSpec.kind
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PASSES: tuple[str, ...] = ("forward", "backward", "end_to_end")


def make_inputs(spec: AttnSpec, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Seeded q, k, v (leaves that require grad) and the output gradient, each (B, H, T, D)."""
    gen = dev.make_generator(device, spec.seed)
    shape = (spec.batch, spec.heads, spec.context, spec.d)
    dtype = TORCH_DTYPES[spec.dtype]
    q, k, v, do = (torch.randn(shape, generator=gen, device=device, dtype=dtype) for _ in range(4))
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), do


def run_spec(spec: AttnSpec) -> dict:
    """Measure `spec` in this process and return its record: ok, or oom / error (naming the
    stage) / unsupported from `core.envelope.measured`, never an exception; every record
    carries the analytic figures. The launcher sets the spec's CPU threads around this call."""
    return measured(KIND, spec, _measure_record, first_stage="making the inputs",
                    unsupported=lambda device: kernels.supports(spec.attention, device,
                                                                TORCH_DTYPES[spec.dtype]),
                    fields={"metrics": {"analytic": analytic_metrics(spec)}})


def _measure_record(spec: AttnSpec, run: Run) -> dict:
    metrics = _measure(spec, run.device, run.stage, run.warnings)
    metrics["analytic"] = run.fields["metrics"]["analytic"]
    mem = metrics["memory"]
    mem["x_score_matrix"] = mem["before_backward_bytes"] / spec.score_matrix_bytes()
    return {"metrics": metrics}


def analytic_metrics(spec: AttnSpec) -> dict:
    """The score/probability matrix a naive implementation materialises, next to q/k/v/o."""
    return {"score_matrix_bytes": spec.score_matrix_bytes(),
            "score_matrix_mib": spec.score_matrix_bytes() / MIB,
            "qkv_each_mib": spec.qkv_bytes() / MIB,
            "formula": "batch * heads * context^2 * bytes per element (one matrix)"}


def _measure(spec: AttnSpec, device: torch.device, stage: Stage, warnings: list[str]) -> dict:
    q, k, v, do = make_inputs(spec, device)
    kernels.check_inputs(spec.attention, q, k, v)  # once: the timed calls skip the check
    fn = kernels.get(spec.attention, validate=False)
    leaves = (q, k, v)

    def forward() -> torch.Tensor:
        return fn(q, k, v, spec.causal)

    def end_to_end() -> None:
        forward().backward(do)

    searches = None  # flash-triton: one more untimed call, first, for its launch search (CUDA)
    if spec.attention == "flash-triton" and spec.warmup:
        stage.now = "searching flash-triton's launch configurations (one untimed fwd + bwd)"
        with flash_configs.searching() as searches:
            end_to_end()
        q.grad = k.grad = v.grad = None
    samples: dict[str, list[float]] = {}
    stage.now = f"timing the forward ({spec.warmup} warm-up + {spec.steps} calls)"
    samples["forward"] = time_calls(forward, device, spec.warmup, spec.steps, leaves)
    stage.now = "running the forward whose graph the backward timing reuses"
    o = forward()
    stage.now = f"timing the backward ({spec.warmup} warm-up + {spec.steps} calls)"
    samples["backward"] = time_calls(lambda: o.backward(do, retain_graph=True), device,
                                     spec.warmup, spec.steps, leaves)
    del o
    stage.now = f"timing forward + backward ({spec.warmup} warm-up + {spec.steps} calls)"
    samples["end_to_end"] = time_calls(end_to_end, device, spec.warmup, spec.steps, leaves)

    stage.now = "accounting for the memory before backward (one untimed forward)"
    memory = memory_before_backward(forward, device, leaves)

    metrics: dict = {"timer": ("cuda_event (do_bench-style, L2 flushed between calls)"
                               if device.type == "cuda" else "perf_counter (PhaseClock, per call)")}
    for name in PASSES:
        metrics[f"{name}_ms"] = summarize(samples[name])
    if (w := spread_warning({n: metrics[f"{n}_ms"] for n in PASSES})):
        warnings.append(w)
    metrics["memory"] = memory
    if searches is not None:  # [] where nothing was searched (the interpreter, a cached key)
        metrics["autotune"] = searches
    if spec.attention == "sdpa":
        stage.now = "asking torch which SDPA backend runs (one untimed forward)"
        metrics["sdpa_backend"] = kernels.sdpa_backend(q, k, v, spec.causal)
    return metrics


def time_calls(fn: Callable[[], object], device: torch.device, warmup: int, steps: int,
               grad_to_none: tuple[torch.Tensor, ...] = ()) -> list[float]:
    """Milliseconds of each of `steps` calls of `fn` after `warmup` untimed ones (raw samples):
    CUDA events with an L2 flush between calls on CUDA (`runtime.device.time_cuda_calls`,
    do_bench's method), PhaseClock (perf_counter) per call on the CPU.

    The `.grad` of `grad_to_none` is reset before every call, outside the timed region, so that
    a backward never times the accumulation into an existing gradient.
    """
    if device.type == "cuda":
        return dev.time_cuda_calls(fn, device, warmup, steps, grad_to_none)
    clock = dev.PhaseClock(device)
    out = []
    for i in range(warmup + steps):
        for t in grad_to_none:
            t.grad = None
        clock.start()
        fn()
        clock.lap("call")
        if i >= warmup:
            out.append(clock.laps["call"])
    for t in grad_to_none:
        t.grad = None
    return out


def _storage(t: torch.Tensor) -> tuple[int, int]:
    """(identity, bytes) of the storage behind `t` (a view counts its whole base, once)."""
    try:
        s = t.untyped_storage()
        return s.data_ptr() or id(s), s.nbytes()
    except (RuntimeError, NotImplementedError):  # e.g. a tensor subclass without storage
        return id(t), t.numel() * t.element_size()


def memory_before_backward(forward: Callable[[], torch.Tensor], device: torch.device,
                           inputs: tuple[torch.Tensor, ...]) -> dict:
    """Bytes that one forward leaves alive for backward, the inputs q, k, v excluded.

    CPU: every tensor autograd saves (saved_tensors_hooks) plus the output, each storage counted
    once. CUDA: `memory_allocated` after the forward minus before it, which is the same set
    (saved tensors, the output) as the allocator sees it. Returns bytes, MiB, the method and,
    on the CPU, one row per save.
    """
    if device.type == "cuda":
        before = dev.memory_allocated(device)
        o = forward()
        after = dev.memory_allocated(device)
        del o
        nbytes = after - before
        return {"before_backward_bytes": nbytes, "before_backward_mib": nbytes / MIB,
                "method": "cuda memory_allocated after the forward minus before (output included)"}
    saved: list[torch.Tensor] = []  # held until counted: a freed storage's address can be reused

    def pack(t: torch.Tensor) -> int:
        saved.append(t)
        return len(saved) - 1

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda i: saved[i]):
        o = forward()
    input_keys = {_storage(t)[0] for t in inputs}
    counted: set[int] = set()
    rows, total = [], 0
    for role, t in [("saved", t) for t in saved] + [("output", o)]:
        key, nbytes = _storage(t)
        counts = key not in input_keys and key not in counted
        counted.add(key)
        total += nbytes if counts else 0
        rows.append({"role": role, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
                     "bytes": nbytes if counts else 0,
                     "note": "input" if key in input_keys else ("" if counts else "storage already counted")})
    del o, saved
    return {"before_backward_bytes": total, "before_backward_mib": total / MIB,
            "method": "saved_tensors_hooks: saved tensors + output, each storage once, inputs excluded",
            "saves": rows}
