"""`lmperf memory`'s plot, drawn from the records: step peaks and saved bytes vs context."""

from __future__ import annotations

from pathlib import Path

from lmperf.questions.memory import readback
from lmperf.units import MIB
from lmperf.questions.memory.phases import two_numbers

CONTEXTS_PNG = "memory_vs_context.png"


def plot_contexts(records: list[dict], path: str | Path) -> Path | None:
    """PNG: step peaks vs context (measured solid, estimate dashed, both above the runtime's
    baseline) and saved bytes vs context. Returns the path, or None with nothing to draw."""
    rows = readback.phase_rows(records)
    saved = readback.saved(records)
    if not rows and not saved:
        return None
    from matplotlib.figure import Figure  # no pyplot: no global figure state

    baseline = readback.baseline(records) or 0.0
    estimates = readback.phase_estimates(records)
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    left, right = fig.subplots(1, 2)
    for key in dict.fromkeys((r.precision, r.mode) for r in rows):
        ok = [r for r in rows if (r.precision, r.mode) == key and r.status == "ok"]
        line, = left.plot([r.context for r in ok], [r.peak() for r in ok], "o-",
                          label=f"{key[0]} {key[1]}")
        est = sorted((t, e) for (p, t, m), e in estimates.items() if (p, m) == key)
        if est:
            left.plot([t for t, _ in est], [baseline + e.total_bytes / MIB for _, e in est],
                      "--", color=line.get_color(), label=f"{key[0]} {key[1]} (estimate)")
    left.set_xlabel("context length T")
    left.set_ylabel(two_numbers(rows).attrs.get("label", "peak MiB") if rows else "peak MiB")
    left.set_title("peak memory of one step")
    for precision in dict.fromkeys(p for p, _ in saved):
        pts = sorted((t, s.activation_bytes / MIB) for (p, t), s in saved.items() if p == precision)
        right.plot([t for t, _ in pts], [v for _, v in pts], "o-", label=f"{precision} measured")
    right.set_xlabel("context length T")
    right.set_ylabel("MiB")
    right.set_title("activations saved for backward")
    for ax in (left, right):
        if ax.lines:
            ax.legend(fontsize=8)
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def plot_timelines(results: dict, plots: str | Path) -> list[Path]:
    """PNGs of simulated steps: live bytes per category over the step's events, stacked, with
    the phase boundaries; one figure per (mode, precision, context), its cases (checkpoint
    groups) side by side (at most 4). `results`: estimate_sim.Case -> SimResult."""
    from matplotlib.figure import Figure

    from lmperf.estimate.simulate import CATEGORIES

    folder = Path(plots)
    by_key: dict[tuple, list] = {}
    for case, res in results.items():
        by_key.setdefault((case.mode, case.precision, case.context), []).append((case, res))
    paths = []
    for (mode, precision, context), items in by_key.items():
        items = items[:4]
        fig = Figure(figsize=(5 * len(items) + 1, 4.2), layout="constrained")
        axes = fig.subplots(1, len(items), squeeze=False)[0]
        for ax, (case, res) in zip(axes, items):
            tl = res.timeline
            ax.stackplot(tl["event"], *[tl[c] / MIB for c in CATEGORIES], labels=CATEGORIES,
                         step="post")
            for phase, first in tl.groupby("phase", sort=False)["event"].min().items():
                ax.axvline(first, color="k", lw=0.6, alpha=0.5)
                ax.annotate(str(phase), (first, 1.0), xycoords=("data", "axes fraction"),
                            fontsize=7, rotation=90, va="top")
            ax.set_title(f"checkpoint {case.group}: peak {res.peak_bytes / MIB:,.0f} MiB",
                         fontsize=9)
            ax.set_xlabel("allocation/free event")
            ax.set_ylabel("live MiB (simulated)")
            ax.grid(True, alpha=0.3)
        axes[0].legend(fontsize=7, loc="upper left")
        fig.suptitle(f"simulated step: {mode}, {precision}, context {context}", fontsize=10)
        path = folder / f"memory_timeline_{mode}_{precision}_ctx{context}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
        paths.append(path)
    return paths
