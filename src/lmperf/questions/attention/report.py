"""Records of the attention sweep -> a Report: one numeric row per configuration, tables of
latency, memory and speedup against the sequence length, and findings.

Parse once, then ask: `frame()` turns records into one numeric row per configuration; each
table is a small pivot of it with one column per implementation (NaN where a configuration did
not run: its status is in the main table, its reason in the notes under it).
"""

from __future__ import annotations

import pandas as pd

from lmperf.core.report import Report, against, caption_axes, status_notes

KIND = "attention"
AXES: tuple[str, ...] = ("attention", "context", "d", "batch", "heads", "dtype", "causal", "device")
GROUP_AXES: tuple[str, ...] = ("dtype", "d", "batch", "heads", "causal", "device")
PASSES = {"forward": "forward", "backward": "backward", "end_to_end": "fwd+bwd"}
NUMERIC: tuple[str, ...] = ("forward_ms", "backward_ms", "end_to_end_ms", "before_backward_mib",
                            "score_matrix_mib", "x_score_matrix", "speedup_vs_naive")


def frame(records: list[dict]) -> pd.DataFrame:
    """One row per record: spec axes, status, median ms per pass (and the number of timed
    calls), memory before backward in MiB and in score matrices, the analytic score matrix
    (MiB), and fwd+bwd speedup over naive at the same shape (NaN without an ok naive row)."""
    rows = []
    for r in records:
        s, m = r["spec"], r.get("metrics") or {}
        row = {k: s.get(k) for k in AXES}
        row["status"] = r["status"]
        for p in PASSES:
            row[f"{p}_ms"] = (m.get(f"{p}_ms") or {}).get("median")
        row["steps"] = (m.get("forward_ms") or {}).get("n")
        mem = m.get("memory") or {}
        row["before_backward_mib"] = mem.get("before_backward_mib")
        row["score_matrix_mib"] = (m.get("analytic") or {}).get("score_matrix_mib")
        row["x_score_matrix"] = mem.get("x_score_matrix")
        row["sdpa_backend"] = m.get("sdpa_backend")
        row["threads"] = s.get("threads")
        row["message"] = r.get("message", "")
        row["device_name"] = (r.get("env") or {}).get("device_name")
        rows.append(row)
    df = pd.DataFrame(rows, columns=[*AXES, "status", "forward_ms", "backward_ms", "end_to_end_ms",
                                     "steps", "before_backward_mib", "score_matrix_mib",
                                     "x_score_matrix", "sdpa_backend", "threads", "message",
                                     "device_name"])
    for col in NUMERIC[:-1]:
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    df.insert(df.columns.get_loc("x_score_matrix") + 1, "speedup_vs_naive", _speedup(df))
    return df


def _speedup(df: pd.DataFrame) -> list[float]:
    """naive's fwd+bwd median / each row's, matched on every axis but the implementation: a
    results file may hold one configuration several times (several sweeps appended), so each
    row is held against naive by `core.report.against` (the latest ok naive row of its shape
    at or before it: the same sweep's), as bench's ratios are."""
    keys = list(df[[a for a in AXES if a != "attention"]].itertuples(index=False))
    refs = against(keys, list((df["attention"] == "naive") & (df["status"] == "ok")))
    times = df["end_to_end_ms"].tolist()
    return [times[j] / t if st == "ok" and j is not None and t > 0 else float("nan")
            for j, st, t in zip(refs, df["status"], times)]


def groups(df: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(caption, rows) per combination of the non-context axes, varying axes named in the caption."""
    varying = [a for a in GROUP_AXES if df[a].nunique(dropna=False) > 1]
    if not varying:
        return [("", df)]
    out = []
    for key, g in df.groupby(varying, sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        out.append((", ".join(f"{a} {v}" for a, v in zip(varying, key)), g))
    return out


def _pivot(g: pd.DataFrame, column: str) -> pd.DataFrame:
    """context, then one numeric column per implementation (in the order they ran)."""
    impls = list(dict.fromkeys(g["attention"]))
    last = g.drop_duplicates(["attention", "context"], keep="last")
    table = last.pivot(index="context", columns="attention", values=column).reindex(columns=impls)
    table = table.sort_index().reset_index()
    table.columns.name = None
    return table


def tables(df: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Titled numeric tables per group of axes: latency (ms, median) per pass, memory before
    backward (MiB) with the analytic score matrix, and speedup of fwd+bwd over naive. A group
    where nothing ran has no tables (the main table says why)."""
    out: dict[str, pd.DataFrame] = {}
    for caption, g in (groups(df) if not df.empty else []):
        if not (g["status"] == "ok").any():
            continue
        suffix = f" [{caption}]" if caption else ""
        for p, title in PASSES.items():
            out[f"{title} latency, ms (median){suffix}"] = _pivot(g, f"{p}_ms")
        mem = _pivot(g, "before_backward_mib")
        p_mib = g.drop_duplicates("context").set_index("context")["score_matrix_mib"]
        mem["P matrix (analytic)"] = [p_mib[t] for t in mem["context"]]
        out[f"memory before backward, MiB (inputs excluded){suffix}"] = mem
        if g["speedup_vs_naive"].notna().any():
            out[f"speedup of fwd+bwd over naive (x){suffix}"] = _pivot(g, "speedup_vs_naive")
    return out


def headline(df: pd.DataFrame) -> list[str]:
    """The answer per group of axes (two at most): the fastest implementation's fwd+bwd at the
    longest context, its speedup over naive (and the others'), and the least memory left for
    backward there against naive's, in probability matrices P = batch*heads*context^2*bytes."""
    lines: list[str] = []
    ok = df[df["status"] == "ok"]
    for caption, g in (groups(ok) if not ok.empty else [])[:2]:
        t = int(g["context"].max())
        at = g[g["context"] == t].drop_duplicates("attention", keep="last").set_index("attention")
        best, ms = at["end_to_end_ms"].idxmin(), at["end_to_end_ms"].min()
        x = at["speedup_vs_naive"]
        where = f" ({caption})" if caption else ""
        line = f"fastest fwd+bwd at context {t}{where}: {best} {ms:.4g} ms" + (
            f", {x[best]:.2f}x naive" if best != "naive" and x[best] == x[best] else "")
        others = [f"{i} {v:.2f}x" for i, v in x.items() if i not in (best, "naive") and v == v]
        lines.append(line + ("; " + ", ".join(others) if others else ""))
        mem = at["before_backward_mib"].dropna()
        if "naive" in mem.index and len(mem) > 1:
            least = mem.drop("naive").idxmin()
            p = (mem["naive"] - mem[least]) / at.at["naive", "score_matrix_mib"]
            lines.append(f"memory before backward at context {t}: {least} {mem[least]:.3g} MiB, "
                         f"naive {mem['naive']:.3g} MiB ({p:.2f} score matrices P more)")
    return lines


def _display(report: Report) -> tuple[pd.DataFrame, str, list[str]]:
    """The main table for reading: constant axes in the caption, a failed row's status numbered
    and its reason in the notes."""
    df = report.frame
    varying, caption = caption_axes(df, [(a, a) for a in GROUP_AXES])
    out = df[["attention", "context", *[a for a, _ in varying]]].copy()
    for p, title in PASSES.items():
        out[f"{title} ms"] = df[f"{p}_ms"]
    out["before bwd MiB"] = df["before_backward_mib"]
    out["x P"] = df["x_score_matrix"]
    if df["speedup_vs_naive"].notna().any():
        out["speedup"] = df["speedup_vs_naive"]
    out["status"], notes = status_notes(df["status"], df["message"])
    return out, caption, notes


def build_report(records: list[dict]) -> Report:
    """The Report of attention records (rebuilt from the records alone, e.g. by `lmperf table`):
    `frame` one numeric row per configuration, `tables` the pivots against context, `findings`."""
    records = [r for r in records if r["kind"] == KIND]
    df = frame(records)
    device = next((d for d in df["device_name"] if d), "") if not df.empty else ""
    title = "lmperf attention" + (f" on {device}" if device else "") + \
        ": median ms per pass, memory before backward (MiB, x P), speedup over naive"
    pivots = tables(df)  # the main table's numbers against context: --details and the report
    return Report(kind=KIND, frame=df, tables=pivots, records=records,
                  title=title, display=_display, brief=dict.fromkeys(pivots),
                  headline=headline(df))


def summary_line(record: dict) -> str:
    """One progress line: medians per pass and the memory before backward (MiB and in score
    matrices P), or why the configuration did not run."""
    if record["status"] != "ok":
        return f"{record['status']}: {record.get('message', '')}"
    m = record["metrics"]
    times = ", ".join(f"{name} {m[f'{p}_ms']['median']:.3g}"
                      for p, name in (("forward", "fwd"), ("backward", "bwd"),
                                      ("end_to_end", "fwd+bwd")))
    return (f"{times} ms (median of {m['forward_ms']['n']}); before backward "
            f"{m['memory']['before_backward_mib']:.2f} MiB = {m['memory']['x_score_matrix']:.2f} P")
