"""Records of the attention sweep -> tables (latency, memory, speedup vs seq) and PNG plots.

Parse once, then ask: `frame()` turns records into one numeric row per configuration; each
table is a small pivot of it with one column per implementation. A row that did not run shows
its status ('oom', 'unsupported', 'error') in its cell instead of a number.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from lmperf.results.tables import render_sections

GROUP_AXES: tuple[str, ...] = ("dtype", "d", "batch", "heads", "causal", "device")
PASSES = {"forward": "forward", "backward": "backward", "end_to_end": "fwd+bwd"}


def frame(records: list[dict]) -> pd.DataFrame:
    """One row per record: spec axes, status, median ms per pass, memory MiB, analytic P MiB."""
    rows = []
    for r in records:
        s, m = r["spec"], r.get("metrics") or {}
        row = {k: s.get(k) for k in ("impl", "seq", *GROUP_AXES)}
        row["status"] = r["status"]
        for p in PASSES:
            row[f"{p}_ms"] = (m.get(f"{p}_ms") or {}).get("median")
        row["before_backward_mib"] = (m.get("memory") or {}).get("before_backward_mib")
        row["score_matrix_mib"] = (m.get("analytic") or {}).get("score_matrix_mib")
        row["message"] = r.get("message", "")
        rows.append(row)
    return pd.DataFrame(rows)


def _groups(df: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(caption, rows) per combination of the non-seq axes, varying axes named in the caption."""
    varying = [a for a in GROUP_AXES if df[a].nunique(dropna=False) > 1]
    if not varying:
        return [("", df)]
    out = []
    for key, g in df.groupby(varying, sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        out.append((", ".join(f"{a} {v}" for a, v in zip(varying, key)), g))
    return out


def _cell(value: object, status: str, fmt: str) -> object:
    if status != "ok":
        return status
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, fmt)


def _pivot(g: pd.DataFrame, column: str, fmt: str) -> pd.DataFrame:
    impls = list(dict.fromkeys(g["impl"]))
    table = pd.DataFrame({"seq": sorted(set(g["seq"]))})
    for impl in impls:
        sub = g[g["impl"] == impl].drop_duplicates("seq", keep="last").set_index("seq")
        table[impl] = [_cell(sub.at[t, column], sub.at[t, "status"], fmt) if t in sub.index else ""
                       for t in table["seq"]]
    return table


def tables(records: list[dict]) -> list[tuple[str, pd.DataFrame]]:
    """Titled tables: latency (ms, median) per pass, memory before backward (MiB) with the
    analytic score matrix, and speedup of fwd+bwd over naive; one set per group of axes."""
    df = frame(records)
    if df.empty:
        return []
    out = []
    for caption, g in _groups(df):
        suffix = f" [{caption}]" if caption else ""
        for p, title in PASSES.items():
            out.append((f"{title} latency, ms (median){suffix}", _pivot(g, f"{p}_ms", ".3g")))
        mem = _pivot(g, "before_backward_mib", ".2f")
        p_mib = g.drop_duplicates("seq").set_index("seq")["score_matrix_mib"]
        mem["P matrix (analytic)"] = [format(p_mib[t], ".2f") for t in mem["seq"]]
        out.append((f"memory before backward, MiB (inputs excluded){suffix}", mem))
        sp = speedup(g)
        if sp is not None:
            out.append((f"speedup of fwd+bwd over naive (x){suffix}", sp))
    return out


def speedup(g: pd.DataFrame) -> pd.DataFrame | None:
    """naive's fwd+bwd median / each implementation's, per seq; None without ok naive rows."""
    ok = g[g["status"] == "ok"]
    naive = ok[ok["impl"] == "naive"].drop_duplicates("seq", keep="last").set_index("seq")["end_to_end_ms"]
    if naive.empty:
        return None
    table = pd.DataFrame({"seq": sorted(set(g["seq"]))})
    for impl in dict.fromkeys(g["impl"]):
        sub = g[g["impl"] == impl].drop_duplicates("seq", keep="last").set_index("seq")
        cells = []
        for t in table["seq"]:
            if t not in sub.index:
                cells.append("")
            elif sub.at[t, "status"] != "ok":
                cells.append(sub.at[t, "status"])
            elif t not in naive.index:
                cells.append("-")
            else:
                cells.append(format(naive[t] / sub.at[t, "end_to_end_ms"], ".2f"))
        table[impl] = cells
    return table


def findings(records: list[dict]) -> list[str]:
    """Sentences over measured values: flash-torch vs naive memory, and every row that did not run."""
    df = frame(records)
    notes = []
    if df.empty:
        return notes
    ok = df[df["status"] == "ok"]
    for caption, g in _groups(ok):
        naive = g[g["impl"] == "naive"].set_index("seq")
        flash = g[g["impl"] == "flash-torch"].set_index("seq")
        both = sorted(set(naive.index) & set(flash.index))
        if not both:
            continue
        parts = []
        for t in both:
            saved = naive.at[t, "before_backward_mib"] - flash.at[t, "before_backward_mib"]
            parts.append(f"seq {t}: {saved:+.2f} MiB ({saved / naive.at[t, 'score_matrix_mib']:.2f} P)")
        where = f" ({caption})" if caption else ""
        notes.append(f"memory before backward, naive minus flash-torch{where}, in MiB and in "
                     f"probability matrices P = batch*heads*seq^2*bytes: " + "; ".join(parts))
    for _, r in df[df["status"] != "ok"].iterrows():
        notes.append(f"{r['impl']} seq {r['seq']} d {r['d']} {r['dtype']}: {r['status']}: "
                     + " ".join(str(r["message"]).split()))
    return notes


def render(records: list[dict], fmt: str = "text") -> str:
    """All tables and findings as text or Markdown; CSV is the numeric frame."""
    if fmt == "csv":
        return frame(records).to_csv(index=False)
    return render_sections(tables(records), findings(records), fmt)


def write_plots(records: list[dict], folder: Path) -> list[Path]:
    """latency_vs_seq.png (log-log, forward / backward / fwd+bwd), memory_vs_seq.png (with the
    analytic P matrix dashed) and speedup_vs_seq.png into `folder`; returns the paths."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # no pyplot: no global figure state

    df = frame(records)
    ok = df[df["status"] == "ok"]
    folder.mkdir(parents=True, exist_ok=True)
    groups = _groups(ok) if not ok.empty else []
    paths = []

    def lines(ax, column: str, label_prefix: str = "") -> None:
        for caption, g in groups:
            for impl in dict.fromkeys(g["impl"]):
                sub = g[g["impl"] == impl].sort_values("seq")
                label = impl + (f" ({caption})" if caption else "")
                ax.plot(sub["seq"], sub[column], marker="o", label=label_prefix + label)

    fig = Figure(figsize=(15, 4.5))
    FigureCanvasAgg(fig)
    for ax, (p, title) in zip(fig.subplots(1, 3), PASSES.items()):
        lines(ax, f"{p}_ms")
        ax.set(yscale="log", xlabel="sequence length", ylabel="ms (median)",
               title=f"{title} latency")
        _seq_axis(ax, df["seq"])
        ax.grid(True, which="both", alpha=0.3)
    _legend(fig.axes[0])
    fig.tight_layout()
    paths.append(_save(fig, folder / "latency_vs_seq.png"))

    fig = Figure(figsize=(6.5, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    lines(ax, "before_backward_mib")
    for caption, g in groups:
        p = g.drop_duplicates("seq").sort_values("seq")
        ax.plot(p["seq"], p["score_matrix_mib"], "k--", alpha=0.6,
                label="P matrix, analytic" + (f" ({caption})" if caption else ""))
    ax.set(yscale="log", xlabel="sequence length", ylabel="MiB",
           title="memory before backward (inputs excluded)")
    _seq_axis(ax, df["seq"])
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax)
    fig.tight_layout()
    paths.append(_save(fig, folder / "memory_vs_seq.png"))

    fig = Figure(figsize=(6.5, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for caption, g in groups:
        naive = g[g["impl"] == "naive"].set_index("seq")["end_to_end_ms"]
        for impl in dict.fromkeys(g["impl"]):
            sub = g[g["impl"] == impl].set_index("seq").sort_index()
            common = [t for t in sub.index if t in naive.index]
            if common:
                ax.plot(common, [naive[t] / sub.at[t, "end_to_end_ms"] for t in common], marker="o",
                        label=impl + (f" ({caption})" if caption else ""))
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set(xlabel="sequence length", ylabel="x faster than naive (fwd+bwd)",
           title="speedup over naive")
    _seq_axis(ax, df["seq"])
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax)
    fig.tight_layout()
    paths.append(_save(fig, folder / "speedup_vs_seq.png"))
    return paths


def _seq_axis(ax, seqs) -> None:
    """Log-2 x axis labelled with the measured sequence lengths only (no crowded minor labels)."""
    from matplotlib.ticker import NullFormatter

    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(set(seqs)))
    ax.set_xticklabels([str(t) for t in sorted(set(seqs))])
    ax.xaxis.set_minor_formatter(NullFormatter())


def _legend(ax) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=110)
    return path
