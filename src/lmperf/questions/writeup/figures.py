"""The write-up's own figures, drawn from records: bench latency vs context and per-phase
stacked bars (medians, as the tables), profile category shares. (memory, train, attention and amp draw their own: see
`lmperf.questions.writeup.plots`.) matplotlib's object API: no pyplot, no global state."""

from __future__ import annotations

import io
import math

import pandas as pd

from lmperf.questions.writeup.sections import run_labels

PHASES: tuple[str, ...] = ("forward", "backward", "optimizer")
MAX_BARS = 40  # bars in one stacked-bar figure; more would not be readable
# Spec axes of a bench run besides size and precision: a line of the latency plot is one value
# of each, so runs that differ in any of them are never joined by a line.
LINE_AXES: tuple[str, ...] = ("batch", "attention", "warmup", "optimizer", "threads", "device")


def png(fig) -> bytes:
    """The figure as PNG bytes (110 dpi: sharp on a laptop, small enough to embed)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    return fig


def bench_latency(frame: pd.DataFrame, records: list[dict]) -> bytes | None:
    """PNG: the median step time (ms; the bars span the interquartile range of the step's
    samples), as the tables give it, against context length, one panel per mode, one line per
    model size and precision (and any other axis that varies). `frame` is bench's numeric
    frame (`lmperf.questions.bench.table.records_frame`) of `records`, row for row. None
    without an ok row."""
    import numpy as np

    quartiles = []
    for r in records:  # from the raw samples; a record without them: the median +- IQR / 2
        step = (r.get("metrics") or {}).get("step_ms") or {}
        xs = step.get("samples")
        quartiles.append(tuple(np.percentile(xs, (25, 75))) if xs else
                         (step.get("median", math.nan) - (step.get("iqr") or 0) / 2,
                          step.get("median", math.nan) + (step.get("iqr") or 0) / 2))
    frame = frame.assign(q1=[q[0] for q in quartiles], q3=[q[1] for q in quartiles])
    ok = frame[(frame["status"] == "ok") & frame["step_ms_median"].notna()]
    if ok.empty:
        return None
    modes = list(dict.fromkeys(ok["mode"]))
    extra = [a for a in LINE_AXES if ok[a].nunique(dropna=False) > 1]
    fig = _figure(5.2 * len(modes) + 0.6, 4.2)
    for ax, mode in zip(fig.subplots(1, len(modes), squeeze=False)[0], modes):
        rows = ok[ok["mode"] == mode]
        for key, line in rows.groupby(["model", "precision", *extra], sort=False, dropna=False):
            line = line.sort_values("context")
            label = " ".join(str(k) for k in key[:2]) + "".join(
                f" {a}={v}" for a, v in zip(extra, key[2:]))
            median = line["step_ms_median"].astype(float)
            spread = [(median - line["q1"]).clip(lower=0), (line["q3"] - median).clip(lower=0)]
            ax.errorbar(line["context"], median, yerr=spread, marker="o", capsize=3, label=label)
        contexts = sorted(set(int(c) for c in rows["context"]))
        ax.set_xscale("log", base=2)
        ax.set_xticks(contexts, [str(c) for c in contexts])
        ax.minorticks_off()
        _time_axis(ax, rows["step_ms_median"].astype(float), rows["q3"])
        ax.set(xlabel="context length T", ylabel="step time, ms (median, bars: IQR)",
               title=f"mode {mode}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    return png(fig)


def _time_axis(ax, values: pd.Series, tops: pd.Series) -> None:
    """Log y when the times span more than a decade (sizes and contexts together), linear from
    zero otherwise; plain numbers either way (no 5 x 10^0 labels)."""
    from matplotlib.ticker import ScalarFormatter

    low, high = float(values.min()), float(values.max())
    if low > 0 and high / low > 10:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
    else:  # `tops`: the bars' tops, so that no error bar leaves the axes
        ax.set_ylim(0, float(tops.max()) * 1.15)


def bench_phases(records: list[dict]) -> bytes | None:
    """PNG: one horizontal bar per ok bench run, stacked by phase (forward, backward, optimizer;
    the median ms per step, as the tables give it). None without an ok run that timed a
    phase."""
    pairs = [(r, label) for r, label in zip(records, run_labels(records)) if r["status"] == "ok"]
    rows = []
    for r, label in pairs[:MAX_BARS]:
        m = r.get("metrics") or {}
        means = {p: (m.get(f"{p}_ms") or {}).get("median") for p in PHASES}
        if any(v is not None for v in means.values()):
            rows.append((label, means))
    if not rows:
        return None
    title = "time per step by phase (median ms)"
    if len(pairs) > MAX_BARS:
        title += f"; first {MAX_BARS} of {len(pairs)} runs"
    return _stacked_bars(rows, PHASES, "ms per step", title)


def profile_shares(records: list[dict]) -> bytes | None:
    """PNG: one horizontal bar per profiled run and phase, split by operator category (share of
    the phase's self time, from the record's "share of each phase by category" table)."""
    from lmperf.results.record import stored_table

    bars: list[tuple[str, dict[str, float]]] = []
    for r, label in zip(records, run_labels(records)):
        tables = ((r.get("metrics") or {}).get("tables") or {}) if r["status"] == "ok" else {}
        title = next((t for t in tables if t.startswith("share of each phase by category")), None)
        if title is None:
            continue
        df = stored_table(title, tables[title]).set_index("category")
        for phase in df.columns:
            shares = {str(c): float(v) for c, v in df[phase].items()
                      if isinstance(v, (int, float)) and math.isfinite(v)}
            bars.append((f"{label}: {phase}", shares))
    if not bars:
        return None
    categories = list(dict.fromkeys(c for _, shares in bars[:MAX_BARS] for c in shares))
    return _stacked_bars(bars[:MAX_BARS], categories, "share of the phase's operator self time",
                         "where the time goes, by category", share=True)


def _stacked_bars(bars: list[tuple[str, dict]], segments, xlabel: str, title: str,
                  share: bool = False) -> bytes:
    """PNG: one horizontal bar per (label, segment -> value), the first on top, stacked in the
    order of `segments` (a segment without a value in any bar is left out of the legend);
    `share`: the values are fractions, the axis in % from 0 to at least 1."""
    fig = _figure(9.5, 1.4 + 0.34 * len(bars))
    ax = fig.subplots()
    ys = list(range(len(bars)))[::-1]
    left = [0.0] * len(bars)
    for segment in segments:
        widths = [values.get(segment) or 0.0 for _, values in bars]
        if any(widths):
            ax.barh(ys, widths, left=left, label=segment, height=0.7)
            left = [a + b for a, b in zip(left, widths)]
    ax.set_yticks(ys, [label for label, _ in bars], fontsize=8)
    if share:
        ax.set_xlim(0, max(1.0, max(left)))
        ax.xaxis.set_major_formatter("{x:.0%}")
    ax.set(xlabel=xlabel, title=title)
    ax.grid(True, axis="x", alpha=0.3)
    fig.legend(fontsize=8, ncols=min(len(segments), 6), loc="outside lower center")
    return png(fig)


STATUS_COLOURS: dict[str, str] = {"ok": "#2ca02c", "fail": "#d62728", "skip": "#b0b7c3"}
LOWP_CHECK = "low-precision matmul speed"  # the doctor check whose values `doctor_checks` draws


def doctor_checks(records: list[dict]) -> bytes | None:
    """PNG of the doctor records' latest row per check: left, seconds per check coloured by
    status (ok / fail / skip); right, where the low-precision matmul check ran, each dtype's
    matmul time relative to fp32 per device (log scale: 1 = as fast as fp32). None without a
    check to draw."""
    from lmperf.questions.doctor.records import latest_rows

    checks = latest_rows(records)
    if not checks:
        return None
    speeds = [(c["check"], c["values"]["time_over_fp32"]) for c in checks
              if str(c.get("check", "")).startswith(LOWP_CHECK) and c.get("status") == "ok"
              and isinstance((c.get("values") or {}).get("time_over_fp32"), dict)]
    fig = _figure(12 if speeds else 8, 1.4 + 0.22 * len(checks))
    axes = fig.subplots(1, 2 if speeds else 1, squeeze=False, width_ratios=[3, 1] if speeds else None)[0]
    ys = list(range(len(checks)))[::-1]
    axes[0].barh(ys, [float(c.get("seconds") or 0) for c in checks], height=0.7,
                 color=[STATUS_COLOURS.get(c.get("status"), "#555") for c in checks])
    axes[0].set_yticks(ys, [f"{c['check']} ({c.get('status')})" for c in checks], fontsize=7)
    axes[0].set(xlabel="seconds", title="checks: time taken, coloured by status")
    axes[0].grid(True, axis="x", alpha=0.3)
    if speeds:
        ax = axes[1]
        labels = [f"{d}\n{name[len(LOWP_CHECK):].strip(' ()') or 'cpu'}"
                  for name, ratios in speeds for d in ratios]
        values = [float(r) for _, ratios in speeds for r in ratios.values()]
        ax.bar(range(len(values)), values, color="#1f77b4")
        ax.axhline(1.0, color="#555", linewidth=1, linestyle="--")
        ax.set_yscale("log")
        ax.set_xticks(range(len(values)), labels, fontsize=8)
        ax.set(ylabel="matmul time / fp32's", title="low precision vs fp32")
        ax.grid(True, axis="y", alpha=0.3)
    return png(fig)
