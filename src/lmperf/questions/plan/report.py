"""The Report of plan records: per search (a file may hold several), the distinct candidates
ranked, the winner with its tokens/s per GPU and MFU, the command that runs it, and what
--confirm measured beside what was planned."""

from __future__ import annotations

import pandas as pd

from lmperf.core.report import Report
from lmperf.estimate.plan import left_out_lines

LAYOUT = ("dp_replicate", "dp_shard", "tp", "pp", "cp", "pp_schedule", "pp_virtual", "async_tp")
COLUMNS = ("rank", "precision", "compile", "float8", "checkpoint", "strategy", *LAYOUT,
           "micro_batch", "grad_accum",
           "peak_gib", "headroom_gib", "fits", "step_s", "compute_s", "exposed_comm_s",
           "bubble_s", "tokens_per_s_per_gpu", "mfu", "why")
TOP = 10  # distinct plans shown per search (besides the best of each strategy)
# what a person reads: one row per layout; why each lost is in the records and `lmperf report`
SHOWN = ("rank", "precision", "checkpoint", "layout", "micro_batch", "grad_accum", "peak_gib",
         "fits", "step_s", "tokens_per_s_per_gpu", "mfu")
SHORT = {"checkpoint": "ckpt", "micro_batch": "b", "grad_accum": "accum",
         "tokens_per_s_per_gpu": "tokens/s/GPU", "mfu": "mfu_share"}  # 120 columns
SCHEDULES = {"GPipe": "gpipe", "1F1B": "1f1b", "Interleaved1F1B": "i1f1b",
             "InterleavedZeroBubble": "izb", "ZBVZeroBubble": "zbv"}


def precision_name(row: dict) -> str:
    """A candidate's precision and levers: 'bf16-fsdp', 'bf16-fsdp+compile',
    'bf16-fsdp+compile+f8r' (float8 rowwise; f8t tensorwise)."""
    float8 = row.get("float8") or "none"
    return (row["precision"] + ("+compile" if row.get("compile") is True else "")
            + (f"+f8{float8[0]}" if float8 != "none" else ""))


def layout_name(row: dict) -> str:
    """A candidate's layout in a few characters: 'fsdp8', 'fsdp4 tp2', 'hsdp2x4 tp8 pp8 i1f1b2',
    'ddp8', 'single', 'fsdp2 cp4', 'fsdp4 tp2 async'; FSDP over the CP ranks alone (its mesh is
    dp_shard x cp, as torchtitan's) 'fsdp tp2 cp4'."""
    tp, pp, cp, rep, shard = (int(row[k]) for k in ("tp", "pp", "cp", "dp_replicate",
                                                    "dp_shard"))
    strategy = row["strategy"]
    fsdp = f"hsdp{rep}x{shard}" if rep > 1 else f"fsdp{shard}" if shard > 1 else \
        "fsdp" if cp > 1 else ""  # sharded over dp_shard x cp; one rank of each: nothing
    parts = [{"single": "", "ddp": f"ddp{rep}", "fsdp": fsdp}.get(strategy, f"{strategy}{shard}")]
    parts += [f"{name}{degree}" for name, degree in (("tp", tp), ("cp", cp), ("pp", pp))
              if degree > 1]
    if pp > 1:
        v = int(row.get("pp_virtual") or 1)
        parts.append(SCHEDULES.get(row.get("pp_schedule"), str(row.get("pp_schedule")))
                     + (str(v) if v > 1 else ""))
    if row.get("async_tp") is True:
        parts.append("async")
    return " ".join(p for p in parts if p) or "single"


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
    rows = [{**{k: r["spec"].get(k) for k in COLUMNS},
             **{k: r["metrics"].get(k) for k in COLUMNS if k not in r["spec"]}} for r in plans]
    frame = _distinct(pd.DataFrame(rows, columns=list(COLUMNS)).sort_values("rank")) if rows \
        else pd.DataFrame(columns=list(COLUMNS) + ["same_as"])
    won, findings = [], []
    if rows:
        m0, spec = plans[0]["metrics"], plans[0]["spec"]
        findings.append(f"{len(rows)} candidates in {m0['search_s']:.1f} s, {len(frame)} distinct, "
                        f"{int(frame['fits'].sum())} fit; every figure {m0['method']}")
        findings += left_out_lines(m0.get("left_out") or {})
        best = frame.iloc[0]
        if best["fits"]:
            won = _winner(spec, plans, best)
        else:  # the candidate closest to fitting says by how much, and where it would fit
            won = ["nothing fits: " + str(frame.loc[frame["peak_gib"].idxmin(), "why"])]
            n = m0.get("fits_on_gpus")
            if n:
                won.append(f"it fits on {n} GPUs (FSDP, every block checkpointed, micro-batch "
                           f"1): `{_again(spec, n)}`")
    for s in [r for r in records if r["spec"].get("cell") == "summary"]:
        m = {k: "n/a" if v is None else format(v, f) for k, f, v in (  # None: no cells, one plan
            (k, f, s["metrics"].get(k)) for k, f in (
                ("boundary_correct", ".0%"), ("peak_error", ".1%"), ("peak_error_median", ".1%"),
                ("collective_bytes_error", ".1%"), ("kendall_tau", ".2f"),
                ("separated_tau", ".2f"),
                ("winner_vs_best", ".2f"), ("step_ratio", ".2f"), ("load_average_1m", ".1f")))}
        layouts = ", ".join(f"{s['metrics'][k]} {name}" for k, name in (
            ("tp_cells", "with TP"), ("pp_cells", "with PP")) if s["metrics"].get(k))
        findings.append(f"confirmed on {s['metrics']['cells']} cells"
                        + (f" ({layouts})" if layouts else "") + f": boundary correct "
                        f"{m['boundary_correct']}, per-rank peak error median "
                        f"{m['peak_error_median']}, worst {m['peak_error']}, collective bytes "
                        f"per mesh dimension worst {m['collective_bytes_error']}, Kendall tau of "
                        f"step times {m['kendall_tau']} ({m['separated_tau']} over the pairs "
                        f"planned more than 2% apart), step measured / predicted "
                        f"{m['step_ratio']}x (median; load {m['load_average_1m']}), the "
                        f"predicted winner's measured step / the best of them "
                        f"{m['winner_vs_best']}")
    findings += [f"{r['spec']['cell']}: {w}; its step is from the rounds that ran"
                 for r in records if r["spec"].get("confirm") and r["status"] == "ok"
                 for w in r.get("warnings", []) if w.startswith("round ")]
    return frame, _shown(frame, top), won, findings


def _distinct(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct prediction (fits, peak and step equal to 4 digits): the best ranked
    kept, naming the alternatives that predict the same in `same_as`."""
    key = [frame["fits"], frame["peak_gib"].map(lambda v: f"{v:.4g}"),
           frame["step_s"].map(lambda v: f"{v:.4g}")]
    kept = []
    for _, group in frame.groupby(key, sort=False):
        first = group.iloc[0]
        others = [f"{layout_name(o)} {precision_name(o)} ckpt {o['checkpoint']} b "
                  f"{o['micro_batch']}" for o in group.iloc[1:].to_dict("records")]
        kept.append(first.to_dict() | {"same_as": ", ".join(others) or None})
    return pd.DataFrame(kept).sort_values("rank").reset_index(drop=True)


def _shown(frame: pd.DataFrame, top: int) -> pd.DataFrame:
    """The fastest candidate of each layout, the first `top` of them and the best of each
    family (strategy, TP, PP, CP or not), laid out (the records keep every candidate)."""
    if frame.empty:
        return frame
    frame = frame.assign(layout=[layout_name(r) for r in frame.to_dict("records")])
    frame = frame[frame.groupby("layout", sort=False)["rank"].transform("min") == frame["rank"]]
    frame = frame.reset_index(drop=True)
    family = [frame["strategy"], frame["tp"] > 1, frame["pp"] > 1, frame["cp"] > 1]
    best = frame.groupby(family, sort=False)["rank"].transform("min") == frame["rank"]
    shown = frame[(frame.index < top) | best]
    out = shown.assign(precision=[precision_name(r) for r in shown.to_dict("records")],
                       mfu=shown["mfu"].astype(float),  # None (no published peak): a dash
                       why=[(f"= {same}; " if isinstance(same, str) else "")
                            + (why if isinstance(why, str) else "")
                            for same, why in zip(shown["same_as"], shown["why"])])
    return out[list(SHOWN)].rename(columns=SHORT)


def _again(spec: dict, gpus: int) -> str:
    """The plan's request again on `gpus` GPUs (a command line)."""
    what = f"--model {spec['model']}" if spec["model"] else f"--size {spec['size']}"
    return (f"lmperf plan {what} --gpu {spec['gpu']} --gpus {gpus} --context {spec['context']}"
            f" --global-batch {max(spec['global_batch'], gpus)}")


def _winner(spec: dict, plans: list[dict], best) -> list[str]:
    """The winner's line, the command that runs it, and its torchtitan 0.3 line (with the
    config module lmperf wrote for it, where it needs one)."""
    from lmperf.questions.plan import torchtitan
    from lmperf.questions.plan.run import command

    mfu = "n/a" if best["mfu"] is None or best["mfu"] != best["mfu"] else f"{100 * best['mfu']:.2g}%"
    if mfu != "n/a" and best.get("float8", "none") not in ("none", None):
        mfu += " of the bf16 peak"  # float8's FLOPs held to the dense bf16 rate, as torchtitan
    out = ["winner: " + layout_name(best.to_dict())
           + f", {precision_name(best.to_dict())}, checkpoint {best['checkpoint']}, "
           f"micro-batch {best['micro_batch']} x {best['grad_accum']}: {best['step_s']:.3g} s "
           f"per step, {best['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, MFU {mfu}, "
           f"{best['peak_gib']:.3g} GiB per rank (predicted)"]
    m = next((r["metrics"] for r in plans if r["metrics"]["rank"] == best["rank"]), {})
    titan, said = m.get("torchtitan_command"), m.get("torchtitan_notes") or []
    if "torchtitan_command" not in m and spec["gpus"] > 1 and spec["device"] == "cuda":
        titan, _, said = torchtitan.job(spec)  # a record from before torchtitan 0.3's line
    line, notes = (command(spec, best) or "").partition("  (")[::2]
    if line:
        out.append(f"run it: `{line}`" + (f" ({notes}" if notes else ""))  # `...`: never wrapped
        if titan:
            out.append(f"on torchtitan 0.3: `{titan}` ({'; '.join(said)})")
    else:
        why = "; ".join(["lmperf dist train runs layouts in fp32 without checkpointing or "
                         "context parallelism, and no --model or grouped-query attention"]
                        + said)
        out.append(f"run it: `{titan}` ({why})" if titan else f"run it: no command ({why})")
    if m.get("torchtitan_config"):
        out.append(f"torchtitan config module of the winner: {m['torchtitan_config']}")
    if m.get("torchtitan_toml"):  # written before torchtitan 0.3, which reads no TOML
        out.append(f"torchtitan 0.2.2 job config of the winner: {m['torchtitan_toml']}")
    return out
