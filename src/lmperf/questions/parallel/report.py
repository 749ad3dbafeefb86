"""The Report of dist records: numeric tables for collectives and strategies, findings, summaries.

`frame` is the strategies table when there are training records (else the collectives table):
one numeric row per (strategy, world size) with step and phase times (slowest rank, medians),
communication / overlap / exposed time, the data-parallel overhead (step at n ranks - step of
`single` with the same per-rank batch), bytes sent per step (counted and analytic), bytes held
per rank and whether the parameters matched single-process training. `tables` add the
collectives ("comm"), bus bandwidth by size ("busbw") and the memory and bytes detail.
"""

from __future__ import annotations

import math

import pandas as pd

from lmperf.core.report import Report, caption_axes, human_bytes, status_notes
from lmperf.measure.stats import NOISY_IQR_RATIO, VERY_NOISY_IQR_RATIO
from lmperf.questions.parallel.spec import SHARDED
from lmperf.units import MIB

_SHAPE_KEYS = ("size", "context", "batch", "device", "backend", "seed", "lr")


def _num(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def _median(summary: dict | None) -> float:
    return _num((summary or {}).get("median"))


def comm_frame(records: list[dict]) -> pd.DataFrame:
    """One row per (collective, size, world size): slowest-rank time, spread, algbw, busbw."""
    rows = []
    for r in records:
        if r["spec"].get("what") != "comm":
            continue
        s, m = r["spec"], r.get("metrics") or {}
        rows.append({"collective": s["collective"], "world_size": s["world_size"],
                     "dtype": s["dtype"], "backend": s["backend"],
                     "bytes": m.get("bytes", s["size_bytes"]), "status": r["status"],
                     "time_ms": _median(m.get("time_ms")),
                     "time_iqr_ms": _num((m.get("time_ms") or {}).get("iqr")),
                     "spread_ms": _median(m.get("spread_ms")),
                     "algbw_gbps": _num(m.get("algbw_gbps")), "busbw_gbps": _num(m.get("busbw_gbps")),
                     "bus_factor": _num(m.get("bus_factor")),
                     "comparable": m.get("comparable"), "message": r.get("message", "")})
    return pd.DataFrame(rows)


def _shape(spec: dict) -> tuple:
    return tuple(spec.get(k) for k in _SHAPE_KEYS)


def train_frame(records: list[dict]) -> pd.DataFrame:
    """One numeric row per (strategy, world size); see the module docstring."""
    train = [r for r in records if r["spec"].get("what") == "train"]
    single = {_shape(r["spec"]): _median(r["metrics"]["step_ms"]) for r in train
              if r["spec"]["strategy"] == "single" and r["status"] == "ok"}
    rows = []
    for r in train:
        s, m = r["spec"], r.get("metrics") or {}
        comm, nbytes = m.get("comm") or {}, m.get("bytes") or {}
        held = (m.get("memory") or {}).get("per_rank") or [{}]
        check = m.get("correctness") or {}
        step = _median(m.get("step_ms"))
        pipe = m.get("pipeline") or {}
        row = {"strategy": s["strategy"], "layout": s.get("layout") or "",  # since issue 42
               "item": _what(r), "world_size": s["world_size"], "size": s["size"],
               "context": s["context"], "batch": s["batch"],
               **{k: s.get(k, v) for k, v in (("precision", "fp32"), ("checkpoint", "none"),
                                              ("grad_accum", 1))},  # since issue 35
               # a sharded strategy computes in --compute-dtype (bf16: its MixedPrecisionPolicy);
               # the record says which (also an old record's 'fsdp', a strategy since removed)
               "compute": m.get("compute_dtype") or (s.get("compute_dtype", "fp32")
                                                      if s["strategy"] in SHARDED else "fp32"),
               "device": s["device"], "backend": s["backend"], "status": r["status"],
               "step_ms": step, "step_iqr_ms": _num((m.get("step_ms") or {}).get("iqr"))}
        for phase in ("forward", "backward", "sync", "optimizer"):
            row[f"{phase}_ms"] = _median(m.get(f"{phase}_ms"))
        row.update({
            "comm_ms": _num(comm.get("comm_ms")), "overlap_ms": _num(comm.get("overlap_ms")),
            "exposed_ms": _num(comm.get("exposed_ms")),
            "dp_overhead_ms": step - single.get(_shape(s), math.nan),
            "tokens_per_s": _num(m.get("tokens_per_s")),
            "sent_mb": _num(nbytes.get("counted_bus_bytes")) / 1e6,
            "analytic_mb": _num(nbytes.get("analytic_bus_bytes")) / 1e6,
            "analytic_backend_mb": _num(nbytes.get("analytic_backend_bus_bytes")) / 1e6,
            "params_mib": max(_num(h.get("parameters_bytes")) for h in held) / MIB,
            "grads_mib": max(_num(h.get("gradients_bytes")) for h in held) / MIB,
            "optimizer_mib": max(_num(h.get("optimizer_bytes")) for h in held) / MIB,
            "peak_mib": max(_num(next(iter((h.get("peak_mib") or {"x": None}).values()), None))
                            for h in held),
            "peak_live_mib": max((_num(b) for b in m.get("peak_live_bytes") or []),
                                 default=math.nan) / MIB,
            "idle_share": max((i / pipe["slots"] for i in pipe.get("idle_slots") or []),
                              default=math.nan),
            "matches_single": check.get("equal"), "max_abs_diff": _num(check.get("max_abs_diff")),
            "max_grad_diff": _num((check.get("gradients") or {}).get("max_abs_diff")),
            "compute_dtype": m.get("compute_dtype"), "message": r.get("message", "")})
        rows.append(row)
    return pd.DataFrame(rows)


def busbw_table(comm: pd.DataFrame, values: str = "busbw_gbps") -> pd.DataFrame:
    """`values` (bus bandwidth in GB/s by default) by collective and world size (rows) and
    message size (columns, named in KiB / MiB: a screen wide for any sweep of sizes)."""
    ok = comm[comm["status"] == "ok"]
    if ok.empty:
        return pd.DataFrame()
    wide = ok.pivot_table(index=["collective", "world_size"], columns="bytes", values=values,
                          sort=False)
    wide.columns = [human_bytes(float(b)) for b in wide.columns]
    return wide.reset_index().rename(columns={"world_size": "n"})


def _display_train(df: pd.DataFrame) -> tuple[pd.DataFrame, str, list[str]]:
    per = "batch per replica" if (df["layout"] != "").any() else "batch per rank"
    axes, caption = caption_axes(df, [("size", "model"), ("context", "context"),
                                      ("batch", per), ("grad_accum", "micro-batches"),
                                      ("precision", "precision"), ("compute", "compute dtype"),
                                      ("checkpoint", "checkpoint"),
                                      ("device", "device"), ("backend", "backend")])
    status, notes = status_notes(df["status"], df["message"])
    out = pd.DataFrame({"strategy": df["strategy"], "n": df["world_size"], "status": status})
    if (df["layout"] != "").any():
        out.insert(1, "layout", df["layout"])
    # before the figures: a screen too narrow for them all leaves out the last (memory) ones
    out["= single"] = ["yes" if v is True else "NO" if v is False else "-" for v in df["matches_single"]]
    for col, _title in axes:
        out[col] = df[col]
    # the step over one rank's: only where a single-rank run of the same shape was measured
    overhead = [("dp_overhead_ms", "DP overhead")] if df["dp_overhead_ms"].notna().any() else []
    if not overhead:
        notes = notes + ["DP overhead (the step over one rank's) needs a run on one rank: "
                         "--world-size 1 and more"]
    for col, title in (("step_ms", "step ms"), ("forward_ms", "fwd"), ("backward_ms", "bwd"),
                       ("sync_ms", "sync"), ("optimizer_ms", "opt"), ("comm_ms", "comm ms"),
                       ("overlap_ms", "overlap"), ("exposed_ms", "exposed"),
                       *overhead, ("tokens_per_s", "tokens/s"),
                       ("sent_mb", "sent MB"), ("analytic_mb", "analytic MB"),
                       ("params_mib", "params MiB"), ("grads_mib", "grads MiB"),
                       ("optimizer_mib", "optim MiB"), ("peak_live_mib", "live peak MiB"),
                       ("peak_mib", "peak MiB")):
        out[title] = df[col]
    caption += ("; times: median over steps of the slowest rank; comm/overlap/exposed from "
                "profiled steps; sent: bus bytes per rank per step; live peak: the fullest "
                "rank's peak of live tensor bytes")
    return out, caption, notes


def _display(report: Report) -> tuple[pd.DataFrame, str, list[str]]:
    """Strategies: `_display_train`. Collectives: the median time (ms) by collective, world
    size and message size, one row per collective (each item's spread, algbw and failures:
    CSV and the records); the failed items as notes."""
    df = report.frame
    if "strategy" in df.columns:
        return _display_train(df)
    axes, caption = caption_axes(df, [("dtype", "dtype"), ("backend", "backend")])
    failed = df[df["status"] != "ok"]
    _, notes = status_notes(failed["status"], [
        f"{r.collective} n={r.world_size} {human_bytes(float(r.bytes))}: {r.message}"
        for r in failed.itertuples()])
    notes.append("time: median over iterations of the slowest rank; GB = 1e9 bytes"
                 + (f"; {caption}" if caption else ""))
    return busbw_table(df, "time_ms"), "", notes


def _train_findings(df: pd.DataFrame) -> list[str]:
    out = []
    ok = df[df["status"] == "ok"]
    if ok.empty:
        return out
    bad = ok[ok["matches_single"] == False]  # noqa: E712 (None: not checked)
    checked = ok[ok["matches_single"].notna()]
    if not bad.empty:
        out.append("NOT equal to single-process training: " + ", ".join(
            f"{r.item} (n={r.world_size}, max diff {r.max_abs_diff:.2g})" for r in bad.itertuples()))
    elif not checked.empty:
        worst = checked.loc[checked["max_abs_diff"].idxmax()]
        how = (f"largest parameter difference {worst['max_abs_diff']:.2g}, {worst['item']}"
               if worst["max_abs_diff"] > 0 else "bitwise: every difference is 0")
        out.append(f"all {len(checked)} strategy runs checked match single-process training on "
                   f"the global batch within tolerance ({how})")
    grads = checked[checked["max_grad_diff"].notna()]
    if not grads.empty:
        worst = grads.loc[grads["max_grad_diff"].idxmax()]
        out.append(f"layouts: the first step's loss and gradients checked against one process "
                   f"too (largest gradient difference {worst['max_grad_diff']:.2g}, "
                   f"{worst['layout']})")
    multi = ok[ok["world_size"] > 1]
    for n, group in multi.groupby("world_size"):
        fastest = group.loc[group["step_ms"].idxmin()]
        line = f"n={n}: fastest {fastest['item']} ({fastest['step_ms']:.1f} ms/step"
        if not math.isnan(fastest["dp_overhead_ms"]):
            line += f", {fastest['dp_overhead_ms']:+.1f} ms vs single"
        out.append(line + ")")
        hidden = group[group["comm_ms"] > 0]
        if not hidden.empty:
            out.append(f"n={n}: share of communication hidden behind compute: " + ", ".join(
                f"{r.item} {r.overlap_ms / r.comm_ms:.0%}" for r in hidden.itertuples()))
        for r in group.itertuples():
            if r.analytic_mb > 0 and abs(r.sent_mb / r.analytic_mb - 1) > 0.01:
                why = (" (the backend's own collectives, costed as it runs them, predict "
                       f"{r.analytic_backend_mb:.3g} MB)" if abs(r.analytic_backend_mb - r.analytic_mb) > 1e-9 else "")
                out.append(f"n={n}: {r.item} sent {r.sent_mb:.3g} MB/step, "
                           f"{r.sent_mb / r.analytic_mb:.2f}x the textbook volume {r.analytic_mb:.3g} MB{why}")
    return out


def _comm_findings(df: pd.DataFrame) -> list[str]:
    out = []
    ok = df[df["status"] == "ok"]
    for (collective, n), group in ok.groupby(["collective", "world_size"]):
        best = group.loc[group["busbw_gbps"].idxmax()]
        out.append(f"{collective} n={n}: busbw peaks at {best['busbw_gbps']:.3g} GB/s "
                   f"({human_bytes(best['bytes'])}, {best['time_ms']:.3g} ms)")
    if not ok.empty:
        worst = ok.loc[(ok["spread_ms"] / ok["time_ms"]).idxmax()]
        out.append(f"largest straggler spread: {worst['collective']} n={worst['world_size']} at "
                   f"{human_bytes(worst['bytes'])}, slowest - fastest rank {worst['spread_ms']:.3g} ms "
                   f"of {worst['time_ms']:.3g} ms")
    return out


def _noise_findings(df: pd.DataFrame) -> list[str]:
    """One line for every collective timing whose IQR/median is above torch.utils.benchmark's
    10% (as bench, train and attention warn), naming the worst; each record carries its own."""
    ok = df[(df["status"] == "ok") & (df["time_ms"] > 0)]
    ratio = ok["time_iqr_ms"] / ok["time_ms"]
    noisy = ratio[ratio > NOISY_IQR_RATIO]
    if noisy.empty:
        return []
    w = ok.loc[noisy.idxmax()]
    how = ("the environment had a significant influence (other load, frequency scaling or too "
           "few --iters)" if noisy.max() > VERY_NOISY_IQR_RATIO else "the machine was noisy")
    return [f"{len(noisy)} of {len(ok)} collective timings have an IQR/median above "
            f"{NOISY_IQR_RATIO:.0%} (worst {noisy.max():.0%}: {w['collective']} n={w['world_size']} "
            f"at {human_bytes(w['bytes'])}, IQR {w['time_iqr_ms']:.3g} ms of median "
            f"{w['time_ms']:.3g} ms): {how}"]


def _what(r: dict) -> str:
    """An item as a reader names it: 'fsdp2', 'tp 4', 'fsdp2, shard 2 x tp 2'."""
    s = r["spec"]
    layout = s.get("layout")
    return layout if layout and s["strategy"] == "none" else (
        f"{s['strategy']}, {layout}" if layout else s["strategy"])


def collectives_table(records: list[dict]) -> pd.DataFrame:
    """The layouts' collectives: one row per (item, collective, mesh dimension), its group's
    size, calls and S bytes per step on each rank (the ledger's, what a plan's prediction of
    the layout is held against)."""
    rows = []
    for r in records:
        per_rank = ((r.get("metrics") or {}).get("collectives") or {}).get("per_rank")
        if r["status"] != "ok" or not r["spec"].get("layout") or not per_rank:
            continue
        keys = sorted({(x["collective"], x["dim"]) for ranks in per_rank for x in ranks})
        for c, d in keys:
            found = [next((x for x in ranks if (x["collective"], x["dim"]) == (c, d)), None)
                     for ranks in per_rank]
            row = {"item": _what(r), "n": r["spec"]["world_size"], "collective": c, "dim": d,
                   "group": max(x["group_size"] for x in found if x),
                   "calls": max(x["calls"] for x in found if x)}
            row.update({f"rank_{i}_bytes": x["bytes"] if x else 0 for i, x in enumerate(found)})
            rows.append(row)
    return pd.DataFrame(rows)


def pipeline_table(records: list[dict]) -> pd.DataFrame:
    """The pipelines' shapes: schedule, micro-batches, the step in slots and each rank's idle
    slots (torch's action lists replayed, one slot per stage forward or backward) beside the
    layout's formula."""
    rows = []
    for r in records:
        pipe = (r.get("metrics") or {}).get("pipeline")
        if r["status"] != "ok" or not pipe:
            continue
        row = {"item": _what(r), "n": r["spec"]["world_size"], "schedule": pipe["schedule"],
               "micro_batches": pipe["micro_batches"], "stages": pipe["stages"],
               "slots": pipe["slots"], "formula_idle": pipe["formula_idle_slots"]}
        row.update({f"rank {i} idle": v for i, v in enumerate(pipe["idle_slots"] or [])})
        rows.append(row)
    return pd.DataFrame(rows)


def headline(records: list[dict]) -> list[str]:
    """The answer: per item (up to 3) its step, tokens/s and whether it trains as one process
    does, a pipeline's idle slots and the fullest rank's peak of live bytes; more items: how
    many match, and the fastest."""
    train = [r for r in records if r["spec"].get("what") == "train"]
    ok = [r for r in train if r["status"] == "ok"]
    if not ok:
        return [f"no strategy ran: {len(train)} failed"] if train else []
    same = {True: "matches one process", False: "DIFFERS from one process"}
    if len(ok) > 3:
        checked = [r for r in ok if r["metrics"]["correctness"]["equal"] is not None]
        good = sum(r["metrics"]["correctness"]["equal"] for r in checked)
        fast = min(ok, key=lambda r: r["metrics"]["step_ms"]["median"])
        return [f"{good} of {len(checked)} runs checked match one process on the global batch; "
                f"fastest {_what(fast)} on {fast['spec']['world_size']} ranks "
                f"({fast['metrics']['step_ms']['median']:.1f} ms/step)"]
    lines = []
    for r in ok:
        m = r["metrics"]
        line = (f"{_what(r)} on {r['spec']['world_size']} ranks: "
                f"{m['step_ms']['median']:.1f} ms/step, {m['tokens_per_s']:,.0f} tokens/s, "
                + same.get(m["correctness"]["equal"], "not checked against one process"))
        pipe = m.get("pipeline") or {}
        if pipe.get("idle_slots"):
            idle = sorted(set(pipe["idle_slots"]))
            line += (f"; each rank idles {'-'.join(map(str, idle))} of {pipe['slots']} slots "
                     f"(formula {pipe['formula_idle_slots']:g})")
        peaks = [b for b in m.get("peak_live_bytes") or [] if b]
        if r["spec"].get("layout") and peaks:
            line += f"; live peak {max(peaks) / MIB:.1f} MiB (fullest rank)"
        lines.append(line)
    return lines


def build_report(records: list[dict]) -> Report:
    """A Report of dist records (training and/or collectives; the rows of `dist leaderboard`,
    which lmperf no longer runs, are left out)."""
    records = [r for r in records if r["kind"] == "dist"
               and r["spec"].get("what") != "leaderboard"]
    comm, train = comm_frame(records), train_frame(records)
    tables: dict[str, pd.DataFrame] = {}
    frame = train if not train.empty else comm
    if not train.empty and not comm.empty:
        tables["comm"] = comm.drop(columns=["message"]) if (comm["message"] == "").all() else comm
    if not comm.empty:
        tables["busbw (GB/s) by message size"] = busbw_table(comm)
    for name, table in (("collectives per step (layouts; bytes: S per rank)",
                         collectives_table(records)),
                        ("pipeline slots (one per stage forward or backward)",
                         pipeline_table(records))):
        if not table.empty:
            tables[name] = table
    findings = (_train_findings(train) if not train.empty else []) + \
               (_comm_findings(comm) + _noise_findings(comm) if not comm.empty else [])
    # per-item noise warnings are summed up by _noise_findings (they stay in each record)
    notes = {w for r in records for w in r.get("warnings", []) if "IQR/median" not in w
             or r["spec"].get("what") != "comm"}
    findings += sorted(notes)
    device = (records or [{}])[0].get("env", {}).get("device_name", "")
    title = "lmperf dist" + (f" on {device}" if device else "")
    return Report(kind="dist", frame=frame, tables={k: v for k, v in tables.items() if not v.empty},
                  findings=findings, records=records, title=title, display=_display,
                  headline=headline(records))


def summary_line(record: dict) -> str:
    """One line for a finished item: a collective's bandwidth, or a strategy's step time."""
    s = record["spec"]
    if record["status"] != "ok":
        return f"{record['status']}: {record.get('message', '')}"
    m = record["metrics"]
    if s.get("what") == "comm":
        return (f"{s['collective']} {human_bytes(m['bytes'])} n={s['world_size']}: {m['time_ms']['median']:.3f} ms, "
                f"algbw {m['algbw_gbps']:.3g} GB/s, busbw {m['busbw_gbps']:.3g} GB/s")
    comm = m.get("comm") or {}
    same = {True: "matches single", False: "DIFFERS from single"}.get(
        m["correctness"]["equal"], "not checked")
    return (f"{_what(record)} n={s['world_size']}: step {m['step_ms']['median']:.1f} ms, exposed "
            f"comm {comm.get('exposed_ms', 0):.1f} ms, {same}")

