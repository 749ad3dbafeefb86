"""Train records -> one PNG with eight panels: training loss, validation loss, the difference
to fp32's loss on the same batches, gradient norm, GradScaler scale, step time, throughput and
peak memory, one colour per regime; from the records alone, so it can be redrawn from the file
(matplotlib's object API: no pyplot, no global state)."""

from __future__ import annotations

import math
from pathlib import Path

from lmperf.runtime.precision import REGIMES
from lmperf.questions.train.report import MEMORY_TITLES, evals_frame, precision_of, status_text, steps_frame

# A fixed colour per regime (tab10 order), so a regime looks the same in every plot.
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
COLOURS: dict[str, str] = {name: _PALETTE[i % len(_PALETTE)] for i, name in enumerate(REGIMES)}


def _finite(values) -> list[float]:
    """inf -> nan, so that matplotlib leaves a gap instead of an off-scale point."""
    return [v if math.isfinite(v) else math.nan for v in values]


def plot_records(records: list[dict], path: str | Path, title: str | None = None) -> Path:
    """Draw the runs of `records` (those with a step log) into the PNG `path`; returns the path.

    A run that stopped early ends its loss curve with an 'x' at the step where it stopped.
    """
    from matplotlib.figure import Figure

    path = Path(path)
    runs = [r for r in records if r["status"] == "ok" and r["metrics"].get("log")]
    fig = Figure(figsize=(20, 9), layout="constrained")
    (ax_loss, ax_val, ax_diff, ax_norm), (ax_scale, ax_time, ax_tps, ax_mem) = fig.subplots(2, 4)
    kinds = {r["metrics"].get("memory_kind") for r in runs}
    base = next((steps_frame(r) for r in runs if precision_of(r) == "fp32"), None)
    scaled = False
    for r in runs:
        name = precision_of(r)
        colour = COLOURS.get(name, "k")
        steps, evals = steps_frame(r), evals_frame(r)
        ax_loss.plot(steps["step"], _finite(steps["loss"]), color=colour, lw=0.8,
                     label=f"{name} ({status_text(r)})")
        ax_val.plot(evals["step"], _finite(evals["val_loss"]), color=colour, marker="o", ms=4, label=name)
        if r["metrics"]["outcome"] != "completed":
            stop = r["metrics"]["outcome_step"]
            finite = steps["loss"][steps["loss"].map(math.isfinite)]
            y = finite.iloc[-1] if len(finite) else evals["val_loss"].iloc[0]
            ax_loss.plot([stop], [y], marker="x", ms=12, mew=3, color=colour)
        if base is not None and name != "fp32":
            n = min(len(base), len(steps))  # same batches at the same steps: a noise-free difference
            diff = steps["loss"].iloc[:n].to_numpy() - base["loss"].iloc[:n].to_numpy()
            ax_diff.plot(steps["step"].iloc[:n], _finite(diff), color=colour, lw=0.8, label=name)
        ax_norm.plot(steps["step"], _finite(steps["grad_norm"]), color=colour, lw=0.8, label=name)
        if steps["scale"].notna().any():
            scaled = True
            ax_scale.step(steps["step"], steps["scale"], where="post", color=colour, label=name)
            skipped = steps[steps["skipped"].astype(bool)]
            ax_scale.plot(skipped["step"], skipped["scale"], "v", color=colour, ms=5,
                          label=f"{name}: skipped step" if len(skipped) else None)
        ax_time.plot(steps["step"], steps["step_ms"], color=colour, lw=0.8, label=name)
        ax_tps.plot(steps["step"], steps["tokens_per_s"], color=colour, lw=0.8, label=name)
        ax_mem.plot(steps["step"], steps["peak_mib"], color=colour, lw=1.0, label=name)

    ax_loss.set(title="training loss per step (x: run stopped)", xlabel="step",
                ylabel="cross-entropy (nats/token)", yscale="log")
    ax_val.set(title="validation loss (fixed batches)", xlabel="step",
               ylabel="cross-entropy (nats/token)", yscale="log")
    ax_diff.set(title="training loss minus fp32's (same batches)", xlabel="step", ylabel="nats/token")
    if base is None:
        ax_diff.text(0.5, 0.5, "needs fp32 in the run", ha="center", va="center",
                     transform=ax_diff.transAxes)
    else:
        ax_diff.axhline(0, color=COLOURS["fp32"], lw=1)
    ax_norm.set(title="gradient norm (after unscaling, before clipping)", xlabel="step",
                ylabel="L2 norm", yscale="log")
    ax_scale.set(title="GradScaler scale (triangles: skipped steps)", xlabel="step", ylabel="scale")
    if scaled:
        ax_scale.set_yscale("log", base=2)
    else:
        ax_scale.text(0.5, 0.5, "no loss-scaled regime in this run\n(fp16-mixed uses a GradScaler)",
                      ha="center", va="center", transform=ax_scale.transAxes)
    ax_time.set(title="step time", xlabel="step", ylabel="ms", yscale="log")
    ax_tps.set(title="throughput", xlabel="step", ylabel="tokens/s", yscale="log")
    mem_title = MEMORY_TITLES.get(next(iter(kinds)), "peak MiB") if len(kinds) == 1 else "peak MiB"
    ax_mem.set(title=f"memory per step: {mem_title}", xlabel="step", ylabel="MiB")
    for ax in (ax_loss, ax_val, ax_diff, ax_norm, ax_scale, ax_time, ax_tps, ax_mem):
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path
