"""`lmperf bench --predict DEVICE...`: predicted per-phase times on a device you may not have.

PREDICTIONS, NOT MEASUREMENTS: nothing runs on the target device. From the per-operator FLOPs
and bytes of the real model at the asked size, context, batch, precision and mode
(`workload.op_costs`: counted on fake tensors, nothing allocated), each phase gets a range:

    ideal   = sum over ops of max(FLOPs / peak FLOP/s in the op's dtype, bytes / peak bandwidth)
    typical = max(sum over ops of max(FLOPs / (peak x f_compute[class]),
                                      bytes / (bandwidth x f_memory[class])),
                  calls x host time per op)

The ideal is the roofline at the datasheet peaks (`runtime.peaks`): no run can beat it. The
typical time holds each op class to a fraction of peak that such kernels usually attain
(FRACTIONS, each with its source) and never below the host's time to issue the ops (an eager
op costs the CPU ~HOST_OP_S whatever the GPU does; the GPU runs behind the host, so the phase
takes the longer of the two totals). Precision maps to peaks as the run would: fp32 -> FP32
FMA (lmperf's fp32 regime turns TF32 off), tf32 -> TF32, bf16/fp16 ops -> tensor-core figures.

`--predict cpu` predicts for this machine instead, from its own measured ceilings, fractions 1:
the ideal is the roofline at the best FLOP/s and bandwidth it attained at any size
(`runtime.ceilings`, `runtime.calibration`); the typical time holds each op to the ceiling of its
own size (`runtime.calibration`, operands out of the cache as in a step: matmul FLOP/s
interpolated at the product's (m, k, n), the bandwidth of one call's working set, the measured
elements/s of exp / log_softmax for ops that compute a transcendental per element, which the
FLOP counter counts as 0), adds the page faults of the fresh memory its outputs take (bytes from
`workload.heap_faults`' replay of the step through glibc's heap, at the calibrated seconds per
byte) and the measured host time per eager op call for every call (each op runs to completion
before the next; per phase, on a generic MLP stack), in the optimizer per parameter tensor (its
Python loops cost more than its few op calls). Only fp32 is calibrated by size: a bf16 product
gets its shape's fp32 figure x one square product's bf16 / fp32 ratio, said NOT VALIDATED in
records and tables (`Target.caveats`). Page faults only on glibc (`fault_method`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import pandas as pd

from lmperf.errors import SpecError

if TYPE_CHECKING:
    from lmperf.runtime.calibration import Calibration
    from lmperf.workload.op_costs import OpCosts

KIND = "prediction"
PHASES: tuple[str, ...] = ("forward", "backward", "optimizer")
HOST_OP_S = 10e-6
HOST_OP_SOURCE = ("assumption: ~10 us of host time per eager aten op (Python, dispatcher, "
                  "kernel launch), the order of torch.profiler's CPU self time per op on a GPU")


@dataclass(frozen=True)
class Fraction:
    """The attained fraction of peak for one op class, of compute and of memory bandwidth."""

    compute: float
    memory: float
    source: str


# op class -> attained fractions of peak (compute, memory), each with its source in short; the
# sources in full: matmul, NVIDIA Deep Learning Performance Guide, 'Matrix Multiplication
# Background' (GEMMs of LM shapes at roughly 60-80% of dense peak) and Megatron-LM (Narayanan et
# al., SC'21: 52% of peak for a whole training step); attention, FlashAttention-2 (Dao, 2023:
# 50-73% of A100 peak forward, less backward); elementwise/norm, an assumption: unfused
# elementwise and reduction kernels at about half of DRAM peak (STREAM-like copies reach 80-90%,
# BabelStream, Deakin et al. 2018; broadcasts, strides and small tensors less); optimizer, an
# assumption: fused AdamW streams parameters, gradients and both moments once, long contiguous
# reads at ~60% of DRAM peak.
FRACTIONS: dict[str, Fraction] = {
    "matmul": Fraction(0.7, 0.7, "GEMMs of LM shapes: 60-80% of peak (NVIDIA DL Perf. Guide)"),
    "attention": Fraction(0.5, 0.5, "FlashAttention-2 (Dao 2023): 50-73% of A100 peak forward"),
    "elementwise/norm": Fraction(1.0, 0.5, "assumed: ~50% of DRAM peak (STREAM copies: 80-90%)"),
    "optimizer": Fraction(1.0, 0.6, "assumed: fused AdamW streams its state at ~60% of DRAM"),
}
METHOD = ("PREDICTED, not measured: per-op FLOPs and bytes of the real model counted on fake "
          "tensors; ideal = roofline at the datasheet peaks, typical = per-class attained "
          "fractions of peak, never below 10 us of host time per op (see "
          "lmperf.questions.bench.predict)")
CPU_METHOD = ("PREDICTED, not measured: per-op FLOPs, bytes and sizes counted on fake tensors; "
              "ideal = roofline at the best ceilings this CPU attained at any size; typical = "
              "each op at the measured ceiling of its own size (matmul FLOP/s by (m, k, n), "
              "bandwidth by working set, elements/s for exp / log / softmax, operands out of "
              "the cache, the optimizer at fused AdamW's bytes/s) + page faults of the fresh "
              "memory a replay of glibc's heap says the step's outputs take + measured host time "
              "per op call x calls (forward, backward: a generic MLP stack's; the optimizer "
              "phase: measured host time per parameter tensor)")
# The columns a GPU prediction sums per (phase, op, dtype): its fractions are per op class.
SUMMED: tuple[str, ...] = ("calls", "flops", "bytes_read", "bytes_written")
FIELDS: tuple[str, ...] = ("ideal_s", "typical_s", "flops", "bytes", "calls")  # a phase's


@dataclass(frozen=True)
class Target:
    """A device to predict for: its name, FLOP/s per math dtype, bandwidth (bytes/s), the
    attained fractions (None: the figures are measured, fractions 1), the host time per op,
    whether it adds to the device time (CPU) or overlaps it (GPU), and the size-aware ceilings
    the typical time uses instead of fractions (this CPU's; None for a GPU)."""

    name: str
    flops_per_s: dict[str, float]
    bandwidth: float
    fractions: dict[str, Fraction] | None
    op_s: float
    additive: bool
    source: str
    calibration: "Calibration | None" = None
    # math dtype -> what a prediction in it cannot vouch for (said in its record and table)
    caveats: dict[str, str] = field(default_factory=dict)


def gpu_targets(name: str) -> list[Target]:
    """The Targets a `--predict` GPU name means: one device of the peak table, or every device
    of a family the name leaves ambiguous ('A100': its 40GB / 80GB, SXM / PCIe forms, whose
    bandwidths differ). Raises SpecError for an unknown name."""
    from lmperf.runtime import peaks

    found = peaks.device_spec(name)
    specs = [found] if found is not None else [
        d for d in peaks.DEVICES.values() if d.name.lower().startswith(name.lower())]
    if not specs:
        peaks.require_device(name)  # raises the one-line error naming the accepted GPUs
    out = []
    for spec in specs:
        flops = {d: spec.peak_tflops(d) * 1e12 for d in peaks.DTYPES if spec.peak_tflops(d)}
        if not flops:
            raise SpecError(f"{spec.name} has no published dense peak: nothing to predict from")
        out.append(Target(spec.name, flops, spec.memory_bandwidth, FRACTIONS, HOST_OP_S, False,
                          spec.source))
    return out


def cpu_target(threads: int | None = None) -> Target:
    """This CPU from its measured ceilings (fp32, bf16, fp16; `runtime.ceilings`) and its size-aware
    calibration (`runtime.calibration`), with `threads` torch threads (None: lmperf's default,
    one). The ideal's ceilings are the best attained at any size."""
    import torch

    from lmperf.core.launch import cpu_threads
    from lmperf.runtime.calibration import calibrate
    from lmperf.runtime.ceilings import measure_ceilings

    with cpu_threads(1 if threads is None else threads):
        c = measure_ceilings(torch.device("cpu"), ("fp32", "bf16", "fp16"))  # every math dtype
        cal = calibrate()
    flops = dict(c.matmul_flops_per_s)
    flops["fp32"] = max(flops["fp32"], *(rate for *_, rate in cal.matmul))
    bandwidth = max(c.bandwidth_bytes_per_s, cal.optimizer_bytes_per_s,
                    *(bw for _, bw in cal.bandwidth))
    caveats = {d: (f"{d} matmuls NOT VALIDATED on this CPU: the fp32 grid's FLOP/s at their "
                   f"shape x the ratio of one square {d} product's (n={n}) to the best fp32 "
                   f"figure; without native {d} a CPU's rate depends on the operands' layout, "
                   f"which the count does not see: the ideal is no floor either")
               for d, n in c.matmul_n.items() if d != "fp32"}
    return Target(f"this CPU ({c.device_name}, {c.threads} thread(s), measured)", flops,
                  bandwidth, None, c.op_overhead_s, True,
                  "measured now (lmperf.runtime.ceilings, lmperf.runtime.calibration)", cal,
                  caveats)


def _math_dtype(dtype: str, tf32: bool) -> str:
    """The peak-table dtype an op row runs at: fp32 rows at TF32 in the tf32 regime."""
    return "tf32" if dtype == "fp32" and tf32 else dtype


def cpu_op_s(row, calibration: "Calibration", rate: float, fp32_rate: float) -> float:
    """Seconds of one costs row (summed over its calls, per-call overhead left out) at the
    ceilings of its own size: the larger of its compute time (a matrix product at the
    calibrated FLOP/s of its (m, k, n), scaled by `rate` / `fp32_rate` for another dtype; an op
    that computes exp / log per element at its measured elements/s; any other op's FLOPs at
    `rate`) and its bytes at the bandwidth of one call's working set (the optimizer's ops at
    fused AdamW's), plus the page faults of the fresh memory its outputs fault in (the row's
    `fault_bytes`, from `workload.heap_faults`'s replay of glibc's heap; 0 when absent)."""
    nbytes = row.bytes_read + row.bytes_written
    per_call = nbytes / max(row.calls, 1)
    memory = nbytes / (calibration.optimizer_bytes_per_s if row.op_class == "optimizer"
                       else calibration.bandwidth_bytes_per_s(per_call))
    if row.m > 0:
        compute = row.flops / (calibration.matmul_flops_per_s(row.m, row.k, row.n)
                               * rate / fp32_rate)
    elif (elements_per_s := calibration.element_rate(row.op, per_call)) is not None:
        compute = row.elements / elements_per_s
    else:
        compute = row.flops / rate
    return max(compute, memory) + calibration.fault_s(getattr(row, "fault_bytes", 0))


def phase_times(costs: pd.DataFrame, target: Target, tf32: bool = False,
                param_tensors: int = 0, returned_bytes: dict | None = None
                ) -> dict[str, tuple]:
    """phase -> (ideal s, typical s, FLOPs, bytes, calls) of one step on `target`;
    `costs` is `OpCosts.table`, `param_tensors` the model's parameter tensors (the CPU's
    optimizer phase pays a measured host time per tensor instead of per op call),
    `returned_bytes` phase -> bytes its frees give back to the kernel (the CPU pays them)."""
    out = {}
    cal = target.calibration
    if cal is None:  # fractions of peak are per op class: one row per (phase, op, dtype)
        costs = costs.groupby(["phase", "op", "dtype", "op_class"], sort=False)[
            list(SUMMED)].sum().reset_index()
    fp32 = target.flops_per_s.get("tf32" if tf32 else "fp32") or max(target.flops_per_s.values())
    for phase, ops in costs.groupby("phase", sort=False):
        ideal = typical = 0.0
        for r in ops.itertuples():
            rate = target.flops_per_s.get(_math_dtype(r.dtype, tf32), fp32)
            nbytes = r.bytes_read + r.bytes_written
            ideal += max(r.flops / rate, nbytes / target.bandwidth)
            if cal is not None:
                typical += cpu_op_s(r, cal, rate, fp32)
                continue
            f = (target.fractions or {}).get(r.op_class)
            fc, fm = (f.compute, f.memory) if f else (1.0, 1.0)
            typical += max(r.flops / (rate * fc), nbytes / (target.bandwidth * fm))
        per_call = cal.op_host_s(phase) if cal is not None else None
        host = float(ops["calls"].sum()) * (target.op_s if per_call is None else per_call)
        optimizer_host = cal.optimizer_host_s(param_tensors) if cal is not None else None
        if phase == "optimizer" and optimizer_host is not None:
            host = optimizer_host  # measured on the step's own optimizer lines, per tensor
        if cal is not None:
            typical += cal.give_back_s((returned_bytes or {}).get(phase, 0))
        typical = typical + host if target.additive else max(typical, host)
        nbytes = int((ops["bytes_read"] + ops["bytes_written"]).sum())
        out[phase] = (ideal, typical, int(ops["flops"].sum()), nbytes, int(ops["calls"].sum()))
    return out


def plan_predictions(devices: Sequence[str], *, size=None, model: str | None = None,
                     context=None, batch=4, precision=None, mode="train-step",
                     attention="naive", clip: float = 1.0, course: str | None = None,
                     model_context: int = 0) -> list:
    """The RunSpecs to predict (bench's keywords; lists sweep). Values left None take the
    defaults of the device predicted for: CUDA's (the `course` edition's table, fp32) for GPUs,
    the CPU's for `cpu` alone. The optimizer is what `auto` picks there: fused AdamW."""
    from lmperf.core.vocabulary import as_list, device_defaults
    from lmperf.model.presets import DEFAULT_COURSE
    from lmperf.workload.spec import Grid

    course = course or DEFAULT_COURSE
    device = "cpu" if [d.lower() for d in devices] == ["cpu"] else "cuda"
    defaults = device_defaults("bench", device, course)
    sizes = as_list(size) or (defaults["size"][:1] if model else defaults["size"])
    fixed = dict(model_context=model_context, optimizer="fused", device=device,
                 model=model, threads=0, clip=clip, course=course)
    grid = Grid(sizes=sizes, contexts=as_list(context) or defaults["context"],
                batches=as_list(batch), precisions=as_list(precision) or defaults["precision"],
                modes=as_list(mode), attentions=as_list(attention), warmups=[0], fixed=fixed)
    return list(dict.fromkeys(grid.expand()))


def predict(specs: Sequence, devices: Sequence[str], threads: int | None = None) -> list[dict]:
    """One prediction record per (spec, device): metrics {phase: {ideal_s, typical_s, flops,
    bytes, calls}} for each phase of the spec's mode and 'step'. Raises SpecError for an unknown
    device before counting, for a `--model` fake tensors cannot run before calibrating the CPU."""
    from lmperf.runtime.precision import get_regime

    if not devices:
        raise SpecError("--predict needs at least one device (a GPU of the peak table, or cpu)")
    gpus = {name: gpu_targets(name) for name in devices if name.lower() != "cpu"}
    counted = [(spec, _counted(spec)) for spec in specs]
    cpu = [cpu_target(threads)] if len(gpus) < len(devices) else []
    targets = [t for name in devices for t in (cpu if name.lower() == "cpu" else gpus[name])]
    records = []
    for spec, costs in counted:
        tf32 = get_regime(spec.precision).tf32
        table = costs.table
        # the math dtypes of the step's products (bf16 under bf16-mixed autocast)
        dtypes = set(table.loc[table["op_class"].isin(["matmul", "attention"]), "dtype"])
        for target in targets:
            times = phase_times(table, target, tf32, costs.param_tensors, costs.returned_bytes)
            metrics = {p: dict(zip(FIELDS, v)) for p, v in times.items()}
            metrics["step"] = {k: sum(m[k] for m in metrics.values()) for k in FIELDS}
            caveats = [c for d, c in sorted(target.caveats.items()) if d in dtypes]
            records.append(_record(spec, target, metrics, costs, caveats))
    return records


def _counted(spec) -> "OpCosts":
    """`count_op_costs(spec)`; a user's `--model` that cannot run on fake tensors (`.item()`,
    no parameters to optimize) raises a one-line SpecError (the reference model's: a bug)."""
    from lmperf.errors import LmperfError
    from lmperf.workload.op_costs import count_op_costs

    try:
        return count_op_costs(spec)
    except Exception as e:
        if spec.model is None or isinstance(e, LmperfError):
            raise
        reason = (str(e).strip().splitlines() or [""])[0]
        raise SpecError(f"--predict cannot count {spec.model} ({spec.mode}) on fake tensors "
                        f"(shapes only, no data): {type(e).__name__}: {reason}") from e


def _record(spec, target: Target, metrics: dict, costs: "OpCosts", caveats: list) -> dict:
    import torch

    from lmperf.results.schema import make_record, to_jsonable
    from lmperf.runtime import env as envmod

    fractions = {k: {"compute": f.compute, "memory": f.memory, "source": f.source}
                 for k, f in (target.fractions or {}).items()}
    prediction = {"predicted": True, "target": target.name, "target_source": target.source,
                  "method": CPU_METHOD if target.additive else METHOD,
                  "count_method": costs.method, "fractions": fractions, "caveats": caveats,
                  "host_op_s": target.op_s,
                  "host_op_source": HOST_OP_SOURCE if not target.additive else (
                      "measured: a one-element add, used only where the calibration's "
                      "forward_op_s / backward_op_s (what the prediction charges) are missing"),
                  "flops_per_s": target.flops_per_s, "bandwidth_bytes_per_s": target.bandwidth}
    if target.calibration is not None:
        from lmperf.runtime.calibration import METHOD as CALIBRATION_METHOD

        prediction |= {"calibration": target.calibration.to_dict(),
                       "calibration_method": CALIBRATION_METHOD,
                       "fault_method": costs.fault_method}
    env = envmod.capture(torch.device("cpu"))  # the machine that computed the prediction
    return to_jsonable(make_record(KIND, spec.to_dict(), "ok", env, metrics=metrics,
                                   prediction=prediction))  # type: ignore[return-value]


def build_report(records: list[dict]):
    """The Report of prediction records: one row per (run, device) with the predicted range of
    each phase in seconds (ideal .. typical); the method in the caption."""
    from lmperf.core.report import Report

    records = [r for r in records if r.get("kind") == KIND]
    rows = []
    for r in records:
        spec, m, p = r["spec"], r["metrics"], r["prediction"]
        row = {"size": spec.get("model") or spec["size"], "context": spec["context"],
               "batch": spec["batch"], "precision": spec["precision"],
               "mode": spec["mode"], "device": p["target"]}
        for phase in PHASES + ("step",):
            if phase in m:
                row[f"{phase}_ideal_s"] = m[phase]["ideal_s"]
                row[f"{phase}_typical_s"] = m[phase]["typical_s"]
        rows.append(row)
    frame = pd.DataFrame(rows)
    predictions = [r["prediction"] for r in records]
    findings = sorted({p["method"] for p in predictions})
    findings += sorted({p["calibration_method"] for p in predictions if "calibration_method" in p})
    findings += sorted({f"page faults: {p['fault_method']}" for p in predictions
                        if p.get("fault_method")} | {c for p in predictions
                                                     for c in p.get("caveats", [])})
    findings += [f"attained fraction for {k}: compute {v['compute']:g}, memory {v['memory']:g} "
                 f"of peak ({v['source']})" for k, v in
                 (records[0]["prediction"]["fractions"] if records else {}).items()]
    if records and not records[0]["prediction"]["host_op_source"].startswith("measured"):
        findings.append(f"host time per op: {HOST_OP_S * 1e6:g} us ({HOST_OP_SOURCE})")
    return Report(kind=KIND, frame=frame, findings=findings, records=records,
                  title="lmperf bench --predict (PREDICTED times, not measurements)",
                  display=_display)


def _display(report):
    """Seconds per phase as 'ideal .. typical' ranges; the caption names the method."""
    df = report.frame
    out = df[["size", "context", "batch", "precision", "mode", "device"]].copy()
    for phase in PHASES + ("step",):
        if f"{phase}_ideal_s" in df:
            out[f"{phase} (s)"] = [
                "-" if math.isnan(a) else f"{_fmt(a)} .. {_fmt(b)}"
                for a, b in zip(df[f"{phase}_ideal_s"], df[f"{phase}_typical_s"])]
    caption = ("PREDICTED seconds per step, ideal roofline .. typical attained fractions; "
               "nothing ran on these devices")
    return out, caption, []


def _fmt(seconds: float) -> str:
    return f"{seconds:.4f}" if seconds < 1 else f"{seconds:.3f}"


def prediction_errors(predictions: list[dict], measured: list[dict]) -> pd.DataFrame:
    """Each predicted phase against the measured bench run of the same size, context, batch,
    precision and mode: one row per (run, phase) with the typical prediction, the measured median
    wall and CPU times (ms; CPU NaN where none, or several threads' summed: no phase time) and the
    signed errors predicted / measured - 1. Only 'ok' bench records with a matching prediction."""
    def key(spec: dict) -> tuple:
        return (spec.get("model") or spec["size"], spec["context"], spec["batch"],
                spec["precision"], spec["mode"])

    typical = {key(r["spec"]): r["metrics"] for r in predictions if r.get("kind") == KIND}
    rows = []
    for r in measured:
        if r.get("kind") != "bench" or r.get("status") != "ok" or key(r["spec"]) not in typical:
            continue
        m, cpu = r["metrics"], r["metrics"].get("cpu_time") or {}
        for phase in PHASES:
            if f"{phase}_ms" not in m or phase not in typical[key(r["spec"])]:
                continue
            predicted = typical[key(r["spec"])][phase]["typical_s"] * 1e3
            wall = m[f"{phase}_ms"]["median"]
            cpu_ms = cpu.get(f"{phase}_ms") if cpu.get("clock") != "process_time" else None
            cpu_ms = cpu_ms["median"] if isinstance(cpu_ms, dict) else math.nan
            rows.append({"size": key(r["spec"])[0], "context": key(r["spec"])[1],
                         "phase": phase, "predicted_ms": predicted, "measured_ms": wall,
                         "cpu_ms": cpu_ms, "error_wall": predicted / wall - 1,
                         "error_cpu": predicted / cpu_ms - 1})
    return pd.DataFrame(rows)
