"""The Report of plan records: the ranked candidates, the winner and its command, and what
--confirm measured beside what was planned."""

from __future__ import annotations

import pandas as pd

from lmperf.core.report import Report

COLUMNS = ("rank", "precision", "checkpoint", "strategy", "tp", "micro_batch", "grad_accum",
           "peak_gib", "headroom_gib", "fits", "step_s", "compute_s", "exposed_comm_s",
           "tokens_per_s_per_gpu", "mfu", "why")


def build_report(records: list[dict]) -> Report:
    """Planned candidates (ranked; `frame`), confirmed cells and their score (`tables`)."""
    plans = [r for r in records if r["kind"] == "plan" and not r["spec"].get("confirm")]
    cells = [r for r in records if r["kind"] == "plan" and r["spec"].get("confirm")
             and r["spec"].get("cell") != "summary"]
    summary = [r for r in records if r["kind"] == "plan" and r["spec"].get("cell") == "summary"]
    rows = [{**{k: r["spec"].get(k) for k in COLUMNS}, **{k: (r.get("metrics") or {}).get(k)
                                                         for k in COLUMNS if k not in r["spec"]}}
            for r in plans if r["status"] == "ok"]
    frame = pd.DataFrame(rows, columns=list(COLUMNS)).sort_values("rank") if rows \
        else pd.DataFrame(columns=list(COLUMNS))
    findings, tables = [], {}
    if rows:
        m0 = plans[0]["metrics"]
        spec = plans[0]["spec"]
        findings.append(f"target: {m0['target']}; {len(rows)} candidates evaluated in "
                        f"{m0['search_s']:.1f} s; {int(frame['fits'].sum())} fit")
        best = frame.iloc[0]
        if best["fits"]:
            findings.append(
                f"winner: {best['strategy']}" + (f" (tp {best['tp']})" if best["tp"] > 1 else "")
                + f", {best['precision']}, checkpoint groups {best['checkpoint'] or 'none'}, "
                f"micro-batch {best['micro_batch']} x {best['grad_accum']}: "
                f"{best['step_s']:.3g} s per step (predicted), {best['peak_gib']:.3g} GiB per "
                f"rank, MFU {best['mfu']:.0%}")
            from lmperf.questions.plan.job import command

            findings.append("run it: " + command(spec, best))
        else:  # the candidate closest to fitting says by how much
            findings.append("nothing fits: " + str(frame.loc[frame["peak_gib"].idxmin(), "why"]))
        findings.append(m0["method"])
    if cells:
        tables["confirmed: planned vs measured"] = pd.DataFrame([{
            "cell": c["spec"]["cell"], "status": c["status"],
            **{k: (c.get("metrics") or {}).get(k) for k in (
                "planned_peak_bytes", "measured_peak_bytes", "peak_error", "planned_fits",
                "measured_fits", "planned_step_s", "measured_step_s")}} for c in cells])
    for s in summary:
        m = {k: "n/a" if v is None else format(v, f) for k, f, v in (  # None: no cells, one plan
            (k, f, s["metrics"][k]) for k, f in (("boundary_correct", ".0%"),
                                                 ("peak_error", ".1%"), ("kendall_tau", ".2f")))}
        findings.append(f"confirmed on {s['metrics']['cells']} cells: boundary correct "
                        f"{m['boundary_correct']}, worst peak error {m['peak_error']}, "
                        f"Kendall tau of step times {m['kendall_tau']}")
    return Report(kind="plan", frame=frame, tables=tables, findings=findings, records=records,
                  title="lmperf plan: the fastest configuration that fits (PREDICTED)")
