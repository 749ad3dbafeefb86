"""`lmperf bench --predict DEVICE...`: predicted per-phase times on a device you may not have.

PREDICTIONS, NOT MEASUREMENTS: the op counts of the real model (`estimate.op_costs`) timed by the
one time model (`estimate.time_model`) on the target (`estimate.target`), as a range ideal ..
typical, with the host's time per op given, measured on the GPU at hand, or the default
(`estimate.host`). The models: docs/commands/plan.md; their errors: docs/accuracy.md."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import pandas as pd

from lmperf.errors import SpecError
from lmperf.estimate.target import HOST_OP_S, cpu_target, gpu_targets
from lmperf.estimate import time_model
from lmperf.estimate.time_model import Target

if TYPE_CHECKING:
    from lmperf.estimate.op_costs import OpCosts

KIND = "prediction"
PHASES: tuple[str, ...] = ("forward", "backward", "optimizer")
METHOD = ("PREDICTED, not measured: per-op FLOPs, bytes and issue order of the real model "
          "counted on fake tensors; ideal = roofline at the datasheet peaks; typical = each op "
          "class at an attained fraction of peak, ops issued by a host that runs ahead of the "
          "GPU at host_op_s per op (lmperf.estimate.time_model)")
CPU_METHOD = ("PREDICTED, not measured: per-op FLOPs and bytes of the real model counted on "
              "fake tensors; ideal = roofline at the ceilings this CPU attained just now; "
              "typical = the same plus its measured host time per op, one thread doing both "
              "(lmperf.estimate.time_model), outputs of 32 MiB or more faulted in at the rate "
              "measured; measured error: median 17%, forward and backward too fast, the "
              "optimizer too slow (tiny..small fp32, docs/accuracy.md): measure instead")
FIELDS: tuple[str, ...] = ("ideal_s", "typical_s", "device_s", "host_s", "flops", "bytes",
                           "calls")  # a phase's metrics


def plan_predictions(devices: Sequence[str], *, size=None, model: str | None = None,
                     context=None, batch=4, precision=None, mode="train-step",
                     attention="naive", clip: float = 1.0, course: str | None = None,
                     model_context: int = 0) -> list:
    """The RunSpecs to predict (bench's keywords; lists sweep). Values left None take the
    defaults of the device predicted for: CUDA's (the `course` edition's table, fp32) for GPUs,
    the CPU's for `cpu` alone; a `model` without `size` gets MODEL_SIZE's shape, as in every
    command. The optimizer is what `auto` picks there: fused AdamW."""
    from lmperf.core.vocabulary import MODEL_SIZE, as_list, device_defaults
    from lmperf.model.presets import DEFAULT_COURSE
    from lmperf.workload.spec import Grid

    course = course or DEFAULT_COURSE
    device = "cpu" if [d.lower() for d in devices] == ["cpu"] else "cuda"
    defaults = device_defaults("bench", device, course)
    sizes = as_list(size) or ([MODEL_SIZE] if model else defaults["size"])
    fixed = dict(model_context=model_context, optimizer="fused", device=device,
                 model=model, threads=0, clip=clip, course=course)
    grid = Grid(sizes=sizes, contexts=as_list(context) or defaults["context"],
                batches=as_list(batch), precisions=as_list(precision) or defaults["precision"],
                modes=as_list(mode), attentions=as_list(attention), warmups=[0], fixed=fixed)
    return list(dict.fromkeys(grid.expand()))


def predict(specs: Sequence, devices: Sequence[str], threads: int | None = None,
            host_us: float | None = None) -> list[dict]:
    """One prediction record per (spec, device): metrics {phase: {ideal_s, typical_s, device_s,
    host_s, flops, bytes, calls}} for each phase of the spec's mode and 'step'. `host_us`: the
    GPU host's time per op in microseconds (None: measured when the GPU is the one at hand, per
    precision, else HOST_OP_S; `estimate.host.host_cost`). Raises SpecError for an unknown
    device or a bad host time before counting, for a `--model` fake tensors cannot run before
    measuring the CPU."""
    from dataclasses import replace

    from lmperf.core.vocabulary import check_target
    from lmperf.estimate.fit import device_fit, fits
    from lmperf.estimate.host import host_cost
    from lmperf.runtime.peaks import device_spec
    from lmperf.runtime.precision import get_regime

    if not devices:
        raise SpecError("--predict needs at least one device (a GPU of the peak table, or cpu)")
    gpus = [name for name in devices if name.lower() != "cpu"]
    check_target(host_us=host_us)
    if host_us is not None and not gpus:
        raise SpecError("--host-us is the host time of a GPU: this CPU's is measured "
                        "(--predict cpu)")
    for name in gpus:
        gpu_targets(name)  # an unknown name: one line, before anything is counted
    # each device counts as it runs: CUDA's autocast lists and op names for a GPU
    counted = {(spec, kind): _counted(replace(spec, device=kind)) for spec in specs
               for kind in dict.fromkeys("cpu" if d.lower() == "cpu" else "cuda"
                                         for d in devices)}
    cpu = [cpu_target(threads)] if len(gpus) < len(devices) else []
    peaks = {spec: device_fit(replace(spec, device="cuda"), None) for spec in specs} \
        if gpus else {}
    records = []
    for spec in specs:
        tf32 = get_regime(spec.precision).tf32
        # the host's time per op of this spec's step: given, measured here, or the default
        targets = [(t, "cpu") if name.lower() == "cpu" else (t, "cuda") for name in devices
                   for t in (cpu if name.lower() == "cpu" else gpu_targets(
                       name, *host_cost(host_us, name, replace(spec, device="cuda"))))]
        for target, kind in targets:
            costs = counted[(spec, kind)]
            table = costs.table
            # the math dtypes of the step's products (bf16 under bf16-mixed autocast)
            dtypes = set(table.loc[table["op_class"].isin(["matmul", "attention"]), "dtype"])
            times = time_model.phase_times(costs, target, tf32)
            metrics = {p: dict(zip(FIELDS, v)) for p, v in times.items()}
            metrics["step"] = {k: sum(m[k] for m in metrics.values()) for k in FIELDS}
            caveats = [c for d, c in sorted(target.caveats.items()) if d in dtypes]
            if kind == "cuda" and peaks.get(spec):  # the same answer to "fits" as plan's
                budget = device_spec(target.name).memory_gib
                metrics["memory"] = {**peaks[spec], "budget_gib": budget,
                                     "fits": fits(peaks[spec]["peak_gib"], budget)}
            records.append(_record(replace(spec, device=kind), target, metrics, costs, caveats))
    return records


def _counted(spec) -> "OpCosts":
    """`count_op_costs(spec)`; flash-triton (Triton kernels, which fake CPU tensors cannot run)
    counted as the one fused kernel SDPA is. A user's `--model` that cannot run on fake tensors
    (`.item()`, no parameters to optimize) raises a one-line SpecError (the reference model's:
    a bug)."""
    from dataclasses import replace

    from lmperf.errors import LmperfError
    from lmperf.estimate.op_costs import count_op_costs

    try:
        if spec.attention == "flash-triton":
            return count_op_costs(replace(spec, attention="sdpa"))
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
                  "method": CPU_METHOD if target.synchronous else METHOD,
                  "count_method": costs.method, "fractions": fractions, "caveats": caveats,
                  "host_op_s": target.host_op_s, "host_op_source": target.host_source,
                  "overlap": "synchronous: host + device per op" if target.synchronous else
                             "host runs ahead of the device; one sync per step, as bench's",
                  "flops_per_s": target.flops_per_s, "bandwidth_bytes_per_s": target.bandwidth,
                  "fresh_bytes_per_s": target.fresh_bytes_per_s}
    env = envmod.capture(torch.device("cpu"))  # the machine that computed the prediction
    return to_jsonable(make_record(KIND, spec.to_dict(), "ok", env, metrics=metrics,
                                   prediction=prediction))  # type: ignore[return-value]


def build_report(records: list[dict]):
    """The Report of prediction records: one row per (run, device) with the predicted range of
    each phase in seconds (ideal .. typical) and what bounds the step; the method in the
    findings."""
    from lmperf.core.report import Report

    records = [r for r in records if r.get("kind") == KIND]
    rows = []
    for r in records:
        spec, m, p = r["spec"], r["metrics"], r["prediction"]
        row = {"size": spec.get("model") or spec["size"], "context": spec["context"],
               "batch": spec["batch"], "precision": spec["precision"],
               "attention": spec["attention"], "mode": spec["mode"], "device": p["target"],
               "host_us": p["host_op_s"] * 1e6}
        for phase in PHASES + ("step",):
            if phase in m:
                row[f"{phase}_ideal_s"] = m[phase]["ideal_s"]
                row[f"{phase}_typical_s"] = m[phase]["typical_s"]
        host, device = m["step"]["host_s"], m["step"]["device_s"]  # None: migrated, unknown
        row["bound"] = "-" if None in (host, device) else "host" if host > device else "device"
        memory = m.get("memory") or {}
        row["peak_gib"], row["fits"] = memory.get("peak_gib"), memory.get("fits")
        rows.append(row)
    frame = pd.DataFrame(rows)
    predictions = [r["prediction"] for r in records]
    findings = sorted({p["method"] for p in predictions})
    findings += sorted({f"host time per op: {p['host_op_s'] * 1e6:g} us ({p['host_op_source']})"
                        for p in predictions})
    findings += sorted({c for p in predictions for c in p.get("caveats", [])})
    misfits = [r for r in rows if r["fits"] is False]
    if misfits:
        findings.insert(0, f"{len(misfits)} of {len(rows)} predicted configuration(s) do NOT fit "
                        "the target's memory (peak_gib: a simulated step + the CUDA allowance, "
                        "as `lmperf memory --estimate` and `lmperf plan` compute it): their "
                        "times are for a run that would fail; try `lmperf plan`")
    findings += [f"attained fraction for {k}: compute {v['compute']:g}, memory {v['memory']:g} "
                 f"of peak ({v['source']})" for k, v in
                 (predictions[0]["fractions"] if predictions else {}).items()]
    return Report(kind=KIND, frame=frame, findings=findings, records=records,
                  title="lmperf bench --predict (PREDICTED times, not measurements)",
                  display=_display, headline=headline(frame), answer=("step (s)", "fits"))


AXES: tuple[str, ...] = ("size", "context", "batch", "precision", "attention", "mode")


def headline(frame: pd.DataFrame, most: int = 4) -> list[str]:
    """The answer: the predicted step (typical, then the ideal roofline) per run and device,
    naming what varies (what holds one value: once, first), and the runs that would not fit."""
    if frame.empty:
        return []
    same = [a for a in AXES if frame[a].nunique() == 1]
    named = {"context": "context {}", "batch": "batch {}"}
    rows = [(" on ".join(filter(None, (" ".join(named.get(a, "{}").format(r[a]) for a in AXES
                                                 if a not in same),
                                       str(r["device"]).split(" (")[0]))),
             r["step_typical_s"], r["step_ideal_s"]) for _, r in frame.iterrows()]
    said = ", ".join(f"{label} {_time(typical)} (ideal {_time(ideal)})"
                     for label, typical, ideal in rows[:most])
    more = f", and {len(rows) - most} more" if len(rows) > most else ""
    setup = ", ".join(f"{a} {frame[a].iloc[0]}" for a in same)
    lines = [f"PREDICTED step time ({setup}): {said}{more}; nothing ran"]
    misfits = frame[frame["fits"] == False]  # noqa: E712 (None: no verdict)
    if len(misfits):
        lines.append(f"does NOT fit: {len(misfits)} of {len(frame)} (peak up to "
                     f"{misfits['peak_gib'].max():.3g} GiB with the CUDA allowance); "
                     "`lmperf plan` finds a setting that does")
    return lines


def _time(seconds: float) -> str:
    """A predicted time for a sentence: '1.3 ms', '2.41 s'."""
    return "-" if seconds != seconds else (f"{seconds * 1e3:.3g} ms" if seconds < 1
                                           else f"{seconds:.3g} s")


def _display(report):
    """Seconds per phase as 'ideal .. typical' ranges; the caption names the method."""
    df = report.frame
    out = df[["size", "context", "batch", "precision", "attention", "mode", "device"]].copy()
    if df["fits"].notna().any():  # GPU targets: does the step fit the card at all
        out["fits"] = ["-" if f is None or f != f else f"{'yes' if f else 'NO'} ({p:.3g} GiB)"
                       for f, p in zip(df["fits"], df["peak_gib"])]
    for phase in PHASES + ("step",):
        if f"{phase}_ideal_s" in df:
            out[f"{phase} (s)"] = [
                "-" if math.isnan(a) else f"{_fmt(a)} .. {_fmt(b)}"
                for a, b in zip(df[f"{phase}_ideal_s"], df[f"{phase}_typical_s"])]
    out["bound"] = df["bound"]
    caption = ("PREDICTED seconds per step, ideal roofline .. typical (attained fractions, host "
               "time per op); bound: what the typical step waits on; nothing ran on these devices")
    return out, caption, []


def _fmt(seconds: float) -> str:
    return f"{seconds:.4f}" if seconds < 1 else f"{seconds:.3f}"


def _measured_on(record: dict, prediction: dict) -> bool:
    """Whether a bench record ran on the device a prediction was for: the CPU for `this CPU`
    (the same CPU model as the machine that predicted, where both say), else a GPU whose name
    the peak table resolves to the target."""
    target = prediction["prediction"]["target"]
    if target.startswith("this CPU"):
        mine = (prediction.get("env") or {}).get("device_name")
        theirs = (record.get("env") or {}).get("device_name")
        return record["spec"].get("device") == "cpu" and (not mine or not theirs
                                                         or mine == theirs)
    from lmperf.runtime import peaks

    name = (record.get("env") or {}).get("device_name") or ""
    found = peaks.spec_for_device_name(name) if name else None
    return found is not None and found.name == target


def prediction_errors(predictions: list[dict], measured: list[dict]) -> pd.DataFrame:
    """Each predicted phase against the measured bench run of the same size, context, batch,
    precision, attention and mode, on the device predicted for: one row per (run, device,
    phase) with the typical prediction, the measured median wall and CPU times (ms; CPU NaN
    where none, or several threads' summed: no phase time) and the signed errors predicted /
    measured - 1. Only 'ok' bench records with a matching prediction."""
    def key(spec: dict) -> tuple:
        return (spec.get("model") or spec["size"], spec["context"], spec["batch"],
                spec["precision"], spec["attention"], spec["mode"])

    rows = []
    for p in (p for p in predictions if p.get("kind") == KIND):
        target = p["prediction"]["target"]
        for r in measured:
            if (r.get("kind") != "bench" or r.get("status") != "ok"
                    or key(r["spec"]) != key(p["spec"]) or not _measured_on(r, p)):
                continue
            m, cpu = r["metrics"], r["metrics"].get("cpu_time") or {}
            for phase in PHASES:
                if f"{phase}_ms" not in m or phase not in p["metrics"]:
                    continue
                predicted = p["metrics"][phase]["typical_s"] * 1e3
                wall = m[f"{phase}_ms"]["median"]
                cpu_ms = cpu.get(f"{phase}_ms") if cpu.get("clock") != "process_time" else None
                cpu_ms = cpu_ms["median"] if isinstance(cpu_ms, dict) else math.nan
                size, context, batch, precision, attention, mode = key(r["spec"])
                rows.append({"size": size, "context": context, "batch": batch,
                             "precision": precision, "attention": attention, "mode": mode,
                             "device": target,
                             "phase": phase, "predicted_ms": predicted, "measured_ms": wall,
                             "cpu_ms": cpu_ms, "error_wall": predicted / wall - 1,
                             "error_cpu": predicted / cpu_ms - 1})
    return pd.DataFrame(rows)
