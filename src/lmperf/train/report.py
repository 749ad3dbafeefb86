"""Train records -> the per-regime summary table, per-step frames, and findings in sentences.

Works from the records alone (as written to the JSONL file), so a table or plot can be rebuilt
later from the file; non-finite numbers, stored as the strings 'nan' / 'inf', are read back here.
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from lmperf.measure.stats import NOISY_IQR_RATIO
from lmperf.results.tables import render_sections
from lmperf.runtime.precision import get_regime
from lmperf.train.loop import FINAL_LOSS_STEPS

MEMORY_TITLES = {"cuda_allocator": "peak GPU MiB", "cpu_process_peak_rss": "peak RSS MiB (CPU process)"}


def num(value: object) -> float:
    """A logged number as a float: None -> nan, 'nan' / 'inf' / '-inf' strings -> floats."""
    if value is None:
        return math.nan
    if isinstance(value, str):
        return float(value)  # float('nan'), float('inf') read the strings to_jsonable wrote
    return float(value)


def regime_of(record: dict) -> str:
    """The regime name of a train record."""
    return record["spec"]["regime"]


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


def status_text(record: dict) -> str:
    """'completed', 'non_finite_loss @ step 2', 'diverged @ step 57', or the record's status."""
    if record["status"] != "ok":
        return record["status"]
    m = record["metrics"]
    return m["outcome"] + (f" @ step {m['outcome_step']}" if m.get("outcome_step") else "")


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
            "regime": regime_of(r), "status": status_text(r),
            "steps": s.get("steps_run", 0),
            "train loss": _fmt(s.get("final_loss"), ".3f") if s else "-",
            "val loss": val if s else "-",
            "step ms mean / median": (f"{_fmt(step_ms.get('mean'), '.1f')} / "
                                      f"{_fmt(step_ms.get('median'), '.1f')}") if step_ms else "-",
            "tokens/s": _fmt(s.get("tokens_per_s"), ",.0f"),
            mem_title: _fmt(s.get("peak_mib"), ",.0f"),
            "skipped": s.get("skipped_steps", "-") if s else "-",
            "final scale": _fmt(s.get("final_scale"), "g"),
        })
    return pd.DataFrame(rows)


def caption(records: list[dict], notes: bool = True) -> str:
    """What every row shares: model, data, batch shape, steps, optimiser, device (and, with
    `notes`, how the loss columns are computed)."""
    spec = records[0]["spec"]
    data = spec.get("data") or {}
    env = records[0].get("env") or {}
    threads = env.get("torch_threads")
    text = (f"{spec['size']} (d_model {spec['d_model']}, {spec['num_layers']} layers, "
            f"vocab {spec['vocab_size']}), {data.get('source', '?')} data "
            f"({data.get('train_tokens', 0):,} train / {data.get('val_tokens', 0):,} val tokens), "
            f"B={spec['batch']} T={spec['context']}, {spec['steps']} steps, AdamW lr {spec['lr']:g}, "
            f"clip {spec['clip']:g}, seed {spec['seed']}, on {env.get('device_name', spec['device'])}"
            + (f" ({threads} thread{'s' if threads != 1 else ''})"
               if spec["device"] == "cpu" and threads else ""))
    if notes:
        text = (f"lmperf train: {text}. Train loss: mean of the last {FINAL_LOSS_STEPS} steps; "
                f"val loss: {spec['eval_batches']} fixed batches")
    return text


def findings(records: list[dict]) -> list[str]:
    """Sentences computed from the records: how each regime ended, against fp32, and why."""
    notes = []
    ok = {regime_of(r): r for r in records if r["status"] == "ok"}
    base = ok.get("fp32")
    base_s = base["metrics"]["summary"] if base else None
    for name, r in ok.items():
        m, s = r["metrics"], r["metrics"]["summary"]
        if m["outcome"] != "completed":
            notes.append(f"{name} stopped with {m['outcome']}: {m['outcome_detail']}"
                         + (f"; {m['nonfinite_params']:,} parameter elements were non-finite by then"
                            if m.get("nonfinite_params") else "") + ".")
            notes.extend(_eps_note(r))
        elif base_s and name != "fp32" and base["metrics"]["outcome"] == "completed":
            v, v0 = num(s["final_val_loss"]), num(base_s["final_val_loss"])
            ratio = num(s["step_ms"]["median"]) / num(base_s["step_ms"]["median"])
            notes.append(f"{name} ends at validation loss {v:.3f} against fp32's {v0:.3f} "
                         f"({(v - v0) / v0:+.2%}); its median step takes {ratio:.2f}x fp32's.")
        if s.get("final_scale") is not None:
            notes.append(_scale_note(name, r))
    noisy = [(regime_of(r), r["metrics"]["summary"]["step_ms"]) for r in ok.values()
             if (r["metrics"]["summary"].get("step_ms") or {}).get("n", 0) >= 4]
    noisy = [(n, st["iqr"] / st["median"]) for n, st in noisy
             if st["median"] > 0 and st["iqr"] / st["median"] > NOISY_IQR_RATIO]
    if noisy:
        notes.append("Step times varied (IQR/median " + ", ".join(f"{n} {q:.0%}" for n, q in noisy)
                     + "): the machine was busy or noisy; mean step time and tokens/s include the "
                     "slow steps, the median does not.")
    for r in records:
        if r["status"] != "ok":
            notes.append(f"{regime_of(r)}: {r['status']}: {r.get('message', '')}")
        for w in r.get("warnings") or []:
            if not w.startswith("IQR/median"):  # summarised above
                notes.append(f"{regime_of(r)}: warning: {w}")
    if any((r.get("metrics") or {}).get("memory_kind") == "cpu_process_peak_rss" for r in records):
        notes.append("Peak memory on the CPU is the whole process's peak RSS (Python and torch "
                     "included), so differences between regimes look small against it.")
    return notes


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
    regime = get_regime(regime_of(record))
    eps = record["spec"]["eps"]
    rounded = torch.tensor(eps, dtype=regime.param_dtype).item()
    if regime.autocast_dtype is not None or regime.param_dtype == torch.float32 or rounded != 0:
        return []
    dtype = str(regime.param_dtype).replace("torch.", "")
    return [f"AdamW's eps {eps:g} rounds to 0 in {dtype}: wherever a gradient entry is exactly 0 "
            "(e.g. embedding rows of tokens absent from the batch) the update is 0/0 = NaN. A larger "
            "eps (e.g. --eps 1e-4) avoids this particular failure."]


def render_summary(records: list[dict], fmt: str = "text") -> str:
    """The summary table under its caption, then the findings, as text or Markdown."""
    if not records:
        return "no train records\n"
    return render_sections([(caption(records), summary_table(records))], findings(records), fmt)
