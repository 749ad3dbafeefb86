"""The Report of plan records: per search (a file may hold several), the distinct candidates
ranked, the winner with its tokens/s per GPU and MFU, the command that runs it, and what
--confirm measured beside what was planned."""

from __future__ import annotations

import pandas as pd

from lmperf.core.report import Report

COLUMNS = ("rank", "precision", "checkpoint", "strategy", "tp", "micro_batch", "grad_accum",
           "peak_gib", "headroom_gib", "fits", "step_s", "compute_s", "exposed_comm_s",
           "tokens_per_s_per_gpu", "mfu", "why")
TOP = 10  # distinct plans shown per search (besides the best of each strategy)
SHOWN = ("rank", "precision", "checkpoint", "strategy", "micro_batch", "grad_accum", "peak_gib",
         "fits", "step_s", "tokens_per_s_per_gpu", "mfu", "why")  # what a person reads
SHORT = {"checkpoint": "ckpt", "micro_batch": "b", "grad_accum": "accum",
         "tokens_per_s_per_gpu": "tokens/s/GPU", "mfu": "mfu_share"}  # 120 columns


def build_report(records: list[dict], top: int = TOP) -> Report:
    """One table per search (`spec.search`) of its distinct candidates: the first `top` and the
    best of each strategy; its winner, the command that runs it and its findings (the
    headline for one search; findings prefixed by the search when there are several).
    `frame`: every distinct candidate of every search, numeric; `tables`: the laid-out ones."""
    searches: dict[str, list[dict]] = {}
    for r in records:
        if r["kind"] == "plan":
            searches.setdefault(r["spec"]["search"], []).append(r)
    frames, tables, findings, headline = [], {}, [], []
    for search, mine in searches.items():
        frame, table, won, said = _search(mine, top)
        heading = _heading(mine[0]) if len(searches) == 1 else \
            f"search {search}: {_heading(mine[0])}"  # two searches of one request stay apart
        frames.append(frame.assign(search=search))
        if not table.empty:
            tables[f"{heading} (PREDICTED)"] = table
        cells = [r for r in mine if r["spec"].get("confirm") and r["spec"]["cell"] != "summary"]
        if cells:
            tables[f"{heading}: confirmed, planned vs measured"] = pd.DataFrame([{
                "cell": c["spec"]["cell"], "status": c["status"],
                **{k: (c.get("metrics") or {}).get(k) for k in (
                    "planned_peak_bytes", "measured_peak_bytes", "peak_error", "planned_step_s",
                    "measured_step_s", "planned_fits", "measured_fits")}} for c in cells])
        if len(searches) == 1:
            headline, findings = won, said
        else:
            findings += [f"search {search}: {s}" for s in won + said]
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)
    return Report(kind="plan", frame=frame, tables=tables, findings=findings, records=records,
                  title="lmperf plan: the fastest configuration that fits (PREDICTED)",
                  headline=headline,
                  display=lambda report: (pd.DataFrame(), "", []))  # the tables say it per search


def _heading(record: dict) -> str:
    """'llama3-8b on 8 x H100-SXM, 80 GiB each, context 8192, global batch 16'."""
    s = record["spec"]
    target = (record.get("metrics") or {}).get("target") or f"{s['gpus']} x {s['gpu'] or s['device']}"
    return (f"{s['model'] or s['size']} on {target}, context {s['context']}, global batch "
            f"{s['global_batch']}")


def _search(records: list[dict], top: int) -> tuple[pd.DataFrame, pd.DataFrame, list[str],
                                                    list[str]]:
    """(distinct candidates, the rows shown laid out, the winner's lines, the other findings)
    of one search's records."""
    plans = [r for r in records if not r["spec"].get("confirm") and r["status"] == "ok"]
    rows = [{**{k: r["spec"].get(k) for k in COLUMNS}, **{k: r["metrics"].get(k) for k in COLUMNS
                                                         if k not in r["spec"]}} for r in plans]
    frame = _distinct(pd.DataFrame(rows, columns=list(COLUMNS)).sort_values("rank")) if rows \
        else pd.DataFrame(columns=list(COLUMNS) + ["same_as"])
    won, findings = [], []
    if rows:
        m0, spec = plans[0]["metrics"], plans[0]["spec"]
        findings.append(f"{len(rows)} candidates in {m0['search_s']:.1f} s, {len(frame)} distinct, "
                        f"{int(frame['fits'].sum())} fit; every figure {m0['method']}")
        best = frame.iloc[0]
        if best["fits"]:
            won = _winner(spec, plans, best)
        else:  # the candidate closest to fitting says by how much
            won = ["nothing fits: " + str(frame.loc[frame["peak_gib"].idxmin(), "why"])]
    for s in [r for r in records if r["spec"].get("cell") == "summary"]:
        m = {k: "n/a" if v is None else format(v, f) for k, f, v in (  # None: no cells, one plan
            (k, f, s["metrics"].get(k)) for k, f in (
                ("boundary_correct", ".0%"), ("peak_error", ".1%"), ("kendall_tau", ".2f"),
                ("winner_vs_best", ".2f")))}
        findings.append(f"confirmed on {s['metrics']['cells']} cells: boundary correct "
                        f"{m['boundary_correct']}, worst peak error {m['peak_error']}, "
                        f"Kendall tau of step times {m['kendall_tau']}, the predicted winner's "
                        f"measured step / the best of them {m['winner_vs_best']}")
    return frame, _shown(frame, top), won, findings


def _distinct(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct prediction (fits, peak and step equal to 4 digits): the best ranked
    kept, naming the alternatives that predict the same in `same_as`."""
    key = [frame["fits"], frame["peak_gib"].map(lambda v: f"{v:.4g}"),
           frame["step_s"].map(lambda v: f"{v:.4g}")]
    kept = []
    for _, group in frame.groupby(key, sort=False):
        first = group.iloc[0]
        others = [f"{o.strategy}{o.tp if o.tp > 1 else ''} {o.precision} ckpt {o.checkpoint} b "
                  f"{o.micro_batch}" for o in group.iloc[1:].itertuples()]
        kept.append(first.to_dict() | {"same_as": ", ".join(others) or None})
    return pd.DataFrame(kept).sort_values("rank").reset_index(drop=True)


def _shown(frame: pd.DataFrame, top: int) -> pd.DataFrame:
    """The first `top` distinct candidates and the best of each (strategy, t), laid out."""
    if frame.empty:
        return frame
    best = frame.groupby(["strategy", "tp"], sort=False)["rank"].transform("min") == frame["rank"]
    shown = frame[(frame.index < top) | best]
    out = shown.assign(strategy=[f"{s}{t}" if t > 1 else s for s, t in zip(shown["strategy"],
                                                                              shown["tp"])],
                       mfu=shown["mfu"].astype(float),  # None (no published peak): a dash
                       why=[(f"= {same}; " if isinstance(same, str) else "")
                            + (why if isinstance(why, str) else "")
                            for same, why in zip(shown["same_as"], shown["why"])])
    return out[list(SHOWN)].rename(columns=SHORT)


def _winner(spec: dict, plans: list[dict], best) -> list[str]:
    """The winner's line, the command that runs it, and its torchtitan job config."""
    from lmperf.questions.plan.run import command, torchrun

    mfu = "n/a" if best["mfu"] is None or best["mfu"] != best["mfu"] else f"{100 * best['mfu']:.2g}%"
    out = ["winner: " + (f"fsdp x tp {best['tp']}" if best["tp"] > 1 else best["strategy"])
           + f", {best['precision']}, checkpoint groups {best['checkpoint'] or 'none'}, "
           f"micro-batch {best['micro_batch']} x {best['grad_accum']}: {best['step_s']:.3g} s "
           f"per step, {best['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, MFU {mfu}, "
           f"{best['peak_gib']:.3g} GiB per rank (predicted)"]
    toml = next((r["metrics"].get("torchtitan_toml") for r in plans
                 if r["metrics"]["rank"] == best["rank"]), None)
    line, notes = (command(spec, best) or "").partition("  (")[::2]
    if not line:
        line, where = torchrun(spec, toml or "TOML")
        notes = (f"{where}; " if where else "") + ("lmperf dist train runs no tensor parallelism, "
                                                  "no --model and no grouped-query attention: "
                                                  "torchtitan does)")
    out.append(f"run it: `{line}`" + (f" ({notes}" if notes else ""))  # `...`: never wrapped
    if toml:
        out.append(f"torchtitan job config of the winner: {toml}")
    return out
