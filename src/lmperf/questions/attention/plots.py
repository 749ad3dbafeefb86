"""The attention sweep's PNG plots: latency, memory before backward and speedup vs sequence length."""

from __future__ import annotations

from pathlib import Path

from lmperf.questions.attention.report import PASSES, frame, groups


def write_plots(records: list[dict], folder: Path | str) -> list[Path]:
    """latency_vs_seq.png (log-log, forward / backward / fwd+bwd), memory_vs_seq.png (with the
    analytic P matrix dashed) and speedup_vs_seq.png into `folder`; returns the paths."""
    from matplotlib.figure import Figure  # no pyplot: no global figure state

    df = frame(records)
    ok = df[df["status"] == "ok"]
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sets = groups(ok) if not ok.empty else []
    paths = []

    def lines(ax, column: str) -> None:
        """One line per implementation and group, over the rows that have `column`."""
        for caption, g in sets:
            for attention in dict.fromkeys(g["attention"]):
                sub = g[g["attention"] == attention].dropna(subset=[column]).sort_values("context")
                if not sub.empty:
                    ax.plot(sub["context"], sub[column], marker="o",
                            label=attention + (f" ({caption})" if caption else ""))

    fig = Figure(figsize=(15, 4.5))
    for ax, (p, title) in zip(fig.subplots(1, 3), PASSES.items()):
        lines(ax, f"{p}_ms")
        ax.set(yscale="log", xlabel="sequence length", ylabel="ms (median)",
               title=f"{title} latency")
        _seq_axis(ax, df["context"])
    paths.append(_save(fig, folder / "latency_vs_seq.png"))

    fig = Figure(figsize=(6.5, 4.5))
    ax = fig.subplots()
    lines(ax, "before_backward_mib")
    for caption, g in sets:
        p = g.drop_duplicates("context").sort_values("context")
        ax.plot(p["context"], p["score_matrix_mib"], "k--", alpha=0.6,
                label="P matrix, analytic" + (f" ({caption})" if caption else ""))
    ax.set(yscale="log", xlabel="sequence length", ylabel="MiB",
           title="memory before backward (inputs excluded)")
    _seq_axis(ax, df["context"])
    paths.append(_save(fig, folder / "memory_vs_seq.png"))

    fig = Figure(figsize=(6.5, 4.5))
    ax = fig.subplots()
    lines(ax, "speedup_vs_naive")  # the frame's: each row against its own sweep's naive
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set(xlabel="sequence length", ylabel="x faster than naive (fwd+bwd)",
           title="speedup over naive")
    _seq_axis(ax, df["context"])
    paths.append(_save(fig, folder / "speedup_vs_seq.png"))
    return paths


def _seq_axis(ax, seqs) -> None:
    """Log-2 x axis labelled with the measured sequence lengths only (no crowded minor labels),
    and a grid."""
    from matplotlib.ticker import NullFormatter

    ax.grid(True, which="both", alpha=0.3)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(set(seqs)))
    ax.set_xticklabels([str(t) for t in sorted(set(seqs))])
    ax.xaxis.set_minor_formatter(NullFormatter())


def _save(fig, path: Path) -> Path:
    """Legend on the first axes (if anything is labelled), tight layout, PNG at `path`."""
    if fig.axes[0].get_legend_handles_labels()[0]:
        fig.axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path
