"""Dist records -> PNGs: step time and exposed communication by strategy; busbw by message size.

Drawn with matplotlib's object API (no pyplot state), from the records alone,
so a figure can be redrawn from the JSONL file.
"""

from __future__ import annotations

from pathlib import Path

from lmperf.questions.parallel.report import comm_frame, train_frame

FOLDER = "dist-plots"


def default_folder(out: str | Path) -> Path:
    """Where the CLI draws the plots without --plots: dist-plots/ beside the results file `out`
    (not in the working directory: a run with --out elsewhere leaves nothing behind here)."""
    return Path(out).parent / FOLDER


def _figure(width: float, height: float, panels: int):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.subplots(1, panels, squeeze=False)[0]


def plot_train(records: list[dict], path: str | Path) -> Path | None:
    """Left: step time split into its phases (timed steps); right: communication per step split
    into hidden behind compute and exposed (profiled steps: a separate pass, so the two panels
    need not add up). One bar per (item: a strategy or a layout, world size); None if there is
    nothing to draw."""
    df = train_frame(records)
    df = df[df["status"] == "ok"] if not df.empty else df
    if df.empty:
        return None
    labels = [f"{s} n={n}" for s, n in zip(df["item"], df["world_size"])]
    x = list(range(len(df)))
    fig, (ax_step, ax_comm) = _figure(max(10, 1.3 * len(df)), 5, 2)
    bottom = df["forward_ms"] * 0
    for phase, colour in (("forward", "#1f77b4"), ("backward", "#ff7f0e"), ("sync", "#d62728"),
                          ("optimizer", "#2ca02c")):
        values = df[f"{phase}_ms"].fillna(0)
        ax_step.bar(x, values, bottom=bottom, label=phase, color=colour)
        bottom = bottom + values
    ax_step.set_title("step time by phase (median of the slowest rank per step)")
    ax_step.set_ylabel("ms")
    hidden, exposed = df["overlap_ms"].fillna(0), df["exposed_ms"].fillna(0)
    ax_comm.bar(x, hidden, label="hidden behind compute", color="#2ca02c")
    ax_comm.bar(x, exposed, bottom=hidden, label="exposed", color="#d62728")
    ax_comm.set_title("communication per step (profiled steps)")
    ax_comm.set_ylabel("ms")
    for ax in (ax_step, ax_comm):
        ax.set_xticks(x, labels, fontsize=8, rotation=35, ha="right")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    shape = df.iloc[0]
    fig.suptitle(f"lmperf dist train: {shape['size']}, context {shape['context']}, "
                 f"batch {shape['batch']} per rank, {shape['backend']} on {shape['device']}")
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


def plot_comm(records: list[dict], path: str | Path) -> Path | None:
    """Bus bandwidth against message size, one line per collective (style per world size)."""
    df = comm_frame(records)
    df = df[df["status"] == "ok"] if not df.empty else df
    if df.empty:
        return None
    fig, (ax_bw, ax_t) = _figure(12, 4.5, 2)
    styles = ["-", "--", ":", "-."]
    for i, (n, by_n) in enumerate(df.groupby("world_size")):
        for j, (collective, group) in enumerate(by_n.groupby("collective")):
            group = group.sort_values("bytes")
            colour = f"C{j}"
            kw = dict(color=colour, linestyle=styles[i % len(styles)], marker="o", ms=3,
                      label=f"{collective} n={n}")
            ax_bw.plot(group["bytes"], group["busbw_gbps"], **kw)
            ax_t.plot(group["bytes"], group["time_ms"], **kw)
    ax_bw.set_title("bus bandwidth (nccl-tests' busbw)")
    ax_bw.set_ylabel("GB/s (1e9 B/s)")
    ax_t.set_title("time per collective (slowest rank, median)")
    ax_t.set_ylabel("ms")
    ax_t.set_yscale("log")
    for ax in (ax_bw, ax_t):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size S (bytes)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    first = df.iloc[0]
    fig.suptitle(f"lmperf dist comm: {first['backend']}, {first['dtype']}")
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


def plot_records(records: list[dict], folder: str | Path) -> list[Path]:
    """Both plots into `folder` (dist-train.png, dist-comm.png) where records allow; the paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    made = [plot_train(records, folder / "dist-train.png"), plot_comm(records, folder / "dist-comm.png")]
    return [p for p in made if p is not None]
