"""Train records -> the Report: a numeric summary per regime (`frame`), the validation losses
per step (`tables`), findings in sentences, and the readable summary table it renders.

Works from the records alone (as written to the JSONL file), so a table or plot can be rebuilt
later from the file; non-finite numbers, stored as the strings 'nan' / 'inf', are read back here.
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from lmperf.core.report import Report, numbered
from lmperf.measure.stats import NOISY_IQR_RATIO
from lmperf.runtime.precision import get_regime
from lmperf.questions.train.loop import FINAL_LOSS_STEPS, status_text
from lmperf.questions.train.spec import regime_label

MEMORY_TITLES = {"cuda_allocator": "peak GPU MiB", "cpu_process_peak_rss": "peak RSS MiB"}


def num(value: object) -> float:
    """A logged number as a float: None -> nan, 'nan' / 'inf' / '-inf' strings -> floats."""
    return math.nan if value is None else float(value)  # float('inf') reads to_jsonable's 'inf'


def precision_of(record: dict) -> str:
    """The precision regime of a train record (' + float8 <recipe>' for a float8 run),
    "(compiled)" after it when it was compiled."""
    spec = record["spec"]
    name = regime_label(spec["precision"], spec.get("float8", "none"))
    return f"{name} (compiled)" if spec.get("compile") else name


def steps_frame(record: dict) -> pd.DataFrame:
    """The per-step log of one record: step, lr, loss, grad_norm, scale, skipped, step_ms,
    tokens_per_s, peak_mib (floats; nan where not finite or not applicable)."""
    log = (record.get("metrics") or {}).get("log") or []
    cols = ("step", "lr", "loss", "grad_norm", "scale", "skipped", "step_ms", "tokens_per_s", "peak_mib")
    df = pd.DataFrame([{c: e.get(c) for c in cols} for e in log], columns=list(cols))
    for c in cols:
        if c != "skipped":
            df[c] = [num(v) for v in df[c]]
    return df


def evals_frame(record: dict) -> pd.DataFrame:
    """The validation log of one record: step, val_loss, eval_ms."""
    evals = (record.get("metrics") or {}).get("evals") or []
    df = pd.DataFrame(evals, columns=["step", "val_loss", "eval_ms"])
    df["val_loss"] = [num(v) for v in df["val_loss"]]
    return df


def _fmt(value: object, spec: str) -> str:
    return "-" if value is None else format(num(value), spec)


def summary_table(records: list[dict]) -> pd.DataFrame:
    """One row per regime, as display strings: status, steps, losses, time, throughput, memory,
    skipped steps, final scale. A validation loss measured before the last step says where."""
    kinds = {(r.get("metrics") or {}).get("memory_kind") for r in records if r.get("metrics")}
    mem_title = MEMORY_TITLES.get(next(iter(kinds)), "peak MiB") if len(kinds) == 1 else "peak MiB"
    rows = []
    for r in records:
        s = (r.get("metrics") or {}).get("summary") or {}
        val = _fmt(s.get("final_val_loss"), ".3f")
        if s and s.get("final_val_step") != s.get("steps_run"):
            val += f" (@{s.get('final_val_step')})"
        step_ms = s.get("step_ms") or {}
        rows.append({
            "precision": precision_of(r), "status": status_text(r),
            "steps": s.get("steps_run", 0),
            "train loss": _fmt(s.get("final_loss"), ".3f") if s else "-",
            "val loss": val if s else "-",
            "step ms": (f"{_fmt(step_ms.get('median'), '.1f')} "
                                      f"({_fmt(step_ms.get('mean'), '.1f')})") if step_ms else "-",
            "tokens/s": _fmt(s.get("tokens_per_s"), ",.0f"),
            mem_title: _fmt(s.get("peak_mib"), ",.0f"),
            "skipped": s.get("skipped_steps", "-") if s else "-",
            "final scale": _fmt(s.get("final_scale"), "g"),
        })
    return pd.DataFrame(rows)


def caption(records: list[dict], notes: bool = True) -> str:
    """What every row shares: model, data, batch shape, steps, optimiser, device (and, with
    `notes`, how the loss columns are computed)."""
    first = next((r for r in records if r.get("corpus")), records[0])  # a failed job may lack it
    spec, data, env = first["spec"], first.get("corpus") or {}, first.get("env") or {}
    if data:
        source = (f"{data.get('source', '?')} data ({data.get('train_tokens', 0):,} train / "
                  f"{data.get('val_tokens', 0):,} val tokens)")
        threads = env.get("torch_threads")  # what the job ran with
    else:  # no job loaded its data (all failed): what was asked for
        source = f"data: {spec.get('data') or spec.get('tokens') or 'bundled corpus'}"
        threads = spec.get("threads")
    text = (f"{spec['size']} (d_model {spec['d_model']}, {spec['num_layers']} layers, "
            f"vocab {spec['vocab_size']}), {source}, "
            f"B={spec['batch']} T={spec['context']}, {spec['steps']} steps, AdamW lr {spec['lr']:g}, "
            f"clip {spec['clip']:g}, seed {spec['seed']}, on {env.get('device_name', spec['device'])}"
            + (f" ({threads} thread{'s' if threads != 1 else ''})"
               if spec["device"] == "cpu" and threads else ""))
    if notes:
        text = (f"{text}. Train loss: mean of the last {FINAL_LOSS_STEPS} steps; "
                f"val loss: {spec['eval_batches']} fixed batches; step ms: median (mean) of the "
                "timed steps, tokens/s from the median; one device sync per step, as lmperf "
                "bench's step")
    return text


def findings(records: list[dict]) -> list[str]:
    """Sentences computed from the records: how each regime ended, against fp32, and why."""
    notes = []
    ok = {precision_of(r): r for r in records if r["status"] == "ok"}
    for name, r in ok.items():
        m, s = r["metrics"], r["metrics"]["summary"]
        if m["outcome"] != "completed":
            notes.append(f"{name} stopped with {m['outcome']}: {m['outcome_detail']}"
                         + (f"; {m['nonfinite_params']:,} parameter elements were non-finite by then"
                            if m.get("nonfinite_params") else "") + ".")
            notes.extend(_eps_note(r))
        elif (ref := _against(r, ok)) is not None:
            ref_s, ref_name = ref["metrics"]["summary"], precision_of(ref)
            v, v0 = num(s["final_val_loss"]), num(ref_s["final_val_loss"])
            ratio = num(s["step_ms"]["median"]) / num(ref_s["step_ms"]["median"])
            notes.append(f"{name} ends at validation loss {v:.3f} against {ref_name}'s {v0:.3f} "
                         f"({(v - v0) / v0:+.2%}); its median step takes {ratio:.2f}x "
                         f"{ref_name}'s.")
        if s.get("final_scale") is not None:
            notes.append(_scale_note(name, r))
    noisy = [(precision_of(r), r["metrics"]["summary"]["step_ms"]) for r in ok.values()
             if (r["metrics"]["summary"].get("step_ms") or {}).get("n", 0) >= 4]
    noisy = [(n, st["iqr"] / st["median"]) for n, st in noisy
             if st["median"] > 0 and st["iqr"] / st["median"] > NOISY_IQR_RATIO]
    if noisy:
        notes.append("Step times varied (IQR/median " + ", ".join(f"{n} {q:.0%}" for n, q in noisy)
                     + "): the machine was busy or noisy; the mean step time includes the "
                     "slow steps, the median (and tokens/s, from it) does not.")
    for r in records:
        if r["status"] != "ok":
            notes.append(f"{precision_of(r)}: {r['status']}: {r.get('message', '')}")
        for w in r.get("warnings") or []:
            if not w.startswith("IQR/median"):  # summarised above
                notes.append(f"{precision_of(r)}: warning: {w}")
    if any((r.get("metrics") or {}).get("memory_kind") == "cpu_process_peak_rss" for r in records):
        notes.append("Peak memory on the CPU is the whole process's peak RSS (Python and torch "
                     "included), so differences between regimes look small against it.")
    return notes


def headline(records: list[dict]) -> list[str]:
    """The answer: each regime's final validation loss (or where it stopped), then its median
    step time, as a ratio to fp32's where fp32 ran."""
    ok = [r for r in records if r["status"] == "ok"]
    if not ok:
        return ["no regime trained: " + ", ".join(f"{precision_of(r)} {r['status']}"
                                                  for r in records)] if records else []
    spec = ok[0]["spec"]
    ends, steps = [], []
    for r in ok:
        m, s = r["metrics"], r["metrics"]["summary"]
        name, loss = precision_of(r), num(s.get("final_val_loss"))
        ends.append(f"{name} {loss:.3f}" if m["outcome"] == "completed" else
                    f"{name} stopped at step {m.get('outcome_step')} ({m['outcome']})")
        steps.append((name, num((s.get("step_ms") or {}).get("median"))))
    failed = [f"{precision_of(r)} {r['status']}" for r in records if r["status"] != "ok"]
    lines = [f"validation loss after {spec['steps']} steps ({spec['size']}, B={spec['batch']} "
             f"T={spec['context']}): " + ", ".join(ends + failed)]
    base = dict(steps).get("fp32")
    if base and len(steps) > 1:
        lines.append(f"median step: fp32 {base:.1f} ms; " + ", ".join(
            f"{n} {ms / base:.2f}x" for n, ms in steps if n != "fp32") + " fp32's")
    else:
        lines.append("median step: " + ", ".join(f"{n} {ms:.1f} ms" for n, ms in steps))
    return lines


def _against(record: dict, ok: dict[str, dict]) -> dict | None:
    """The completed run a run's ending is read against: a float8 run against its own regime
    without float8 (bf16's: what float8 changes), where it ran, else fp32, as every other regime;
    None for fp32 itself or when that run did not complete."""
    spec = record["spec"]
    names = ([precision_of({"spec": {**spec, "float8": "none"}})]
             if spec.get("float8", "none") != "none" else []) + ["fp32"]
    ref = next((ok[n] for n in names if n in ok), None)
    if ref is None or ref is record or ref["metrics"]["outcome"] != "completed":
        return None
    return ref


def _scale_note(name: str, record: dict) -> str:
    """What the GradScaler did: its first and last scale, skipped steps, and why it stayed put."""
    s = record["metrics"]["summary"]
    scales = steps_frame(record)["scale"].dropna()
    if scales.empty:
        return f"{name}: no scale was logged."
    first, final, skipped, n = scales.iloc[0], num(s["final_scale"]), s["skipped_steps"], s["steps_run"]
    text = (f"{name}: GradScaler's scale went from {first:g} to {final:g}; {skipped} of {n} steps "
            "were skipped (an inf/NaN gradient halves the scale and skips the update)")
    interval = s.get("scale_growth_interval")
    if not skipped and interval and n < interval:
        text += (f"; it doubles only after {interval} clean steps in a row, more than this run's "
                 f"{n}, so a flat line means no gradient overflowed")
    return text + "."


def _eps_note(record: dict) -> list[str]:
    """Why a -true run hit NaN when AdamW's eps is not representable in its dtype (measured)."""
    regime = get_regime(record["spec"]["precision"])
    eps = record["spec"]["eps"]
    rounded = torch.tensor(eps, dtype=regime.param_dtype).item()
    if regime.autocast_dtype is not None or regime.param_dtype == torch.float32 or rounded != 0:
        return []
    dtype = str(regime.param_dtype).replace("torch.", "")
    return [f"AdamW's eps {eps:g} rounds to 0 in {dtype}: wherever a gradient entry is exactly 0 "
            "(e.g. embedding rows of tokens absent from the batch) the update is 0/0 = NaN. A larger "
            "eps (e.g. --eps 1e-4) avoids this particular failure."]


def summary_line(record: dict) -> str:
    """One line for a finished regime: how it ended, its final losses and median step time."""
    if record["status"] != "ok":
        return f"{record['status']}: {record.get('message', '')}"
    s = record["metrics"]["summary"]
    step_ms = s.get("step_ms") or {}
    return (f"{status_text(record)}: train loss {_fmt(s.get('final_loss'), '.3f')}, val loss "
            f"{_fmt(s.get('final_val_loss'), '.3f')}, median step "
            f"{_fmt(step_ms.get('median'), '.1f')} ms")


def _summary_row(record: dict) -> dict:
    """The numeric summary of one record (units in the column names; NaN where not measured)."""
    spec, m = record["spec"], record.get("metrics") or {}
    s = m.get("summary") or {}
    step_ms = s.get("step_ms") or {}
    row = {"precision": precision_of(record), "size": spec.get("size"),
           "context": spec.get("context"), "batch": spec.get("batch"), "steps": spec.get("steps"),
           "status": record["status"], "outcome": m.get("outcome"),
           "outcome_step": m.get("outcome_step"), "steps_run": s.get("steps_run", 0),
           "params": record.get("params")}
    for name in ("first_loss", "final_loss", "final_val_loss", "final_val_step"):
        row[name] = num(s.get(name))
    for stat in ("mean", "median", "std", "iqr"):
        row[f"step_ms_{stat}"] = num(step_ms.get(stat))
    row.update({"tokens_per_s": num(s.get("tokens_per_s")), "peak_mib": num(s.get("peak_mib")),
                "memory_kind": m.get("memory_kind"), "skipped_steps": s.get("skipped_steps"),
                "final_scale": num(s.get("final_scale")),
                "device_name": (record.get("env") or {}).get("device_name"),
                "message": record.get("message", "")})
    return row


def summary_frame(records: list[dict]) -> pd.DataFrame:
    """One numeric row per record: the spec's axes, status and outcome, losses (nats/token),
    step time (ms, first steps excluded), tokens/s, peak memory (MiB), skipped steps, scale."""
    return pd.DataFrame([_summary_row(r) for r in records])


def val_loss_table(records: list[dict]) -> pd.DataFrame:
    """Validation loss (nats/token) per evaluated step (rows) and regime (columns)."""
    runs = [(precision_of(r), e) for r in records if not (e := evals_frame(r)).empty]
    if not runs:
        return pd.DataFrame()
    labels = numbered([name for name, _ in runs])  # a file may hold several runs of one regime
    table = pd.DataFrame({label: pd.Series(e["val_loss"].to_numpy(), index=e["step"].astype(int))
                          for label, (_, e) in zip(labels, runs)}).sort_index()
    table.index.name = "step"
    return table.reset_index()


def _display(report: Report) -> tuple[pd.DataFrame, str, list[str]]:
    return summary_table(report.records), caption(report.records), []


def build_report(records: list[dict]) -> Report:
    """A Report of train records: `frame` has one numeric row per regime run, `tables` the
    validation loss per step and regime; rendered as text, Markdown or LaTeX, the summary reads
    as display strings under the run's caption (model, data, batch, steps, device)."""
    records = [r for r in records if r["kind"] == "train"]
    device = next((r.get("env", {}).get("device_name") for r in records
                   if r.get("env", {}).get("device_name")), "")
    tables = {}
    if not (val := val_loss_table(records)).empty:
        tables["validation loss per step"] = val
    return Report(kind="train", frame=summary_frame(records), tables=tables,
                  findings=findings(records) if records else [], records=records,
                  title=f"lmperf train on {device}" if device else "lmperf train",
                  display=_display, headline=headline(records),
                  answer=("val loss", "step ms"))
