"""The Report of bench records: the numeric frame, the course's table layout, one-line summaries."""

from __future__ import annotations

from lmperf.questions.bench.rounds import latest_view
from lmperf.questions.bench.table import display_frame, records_frame
from lmperf.core.report import Report


def _display(report: Report):
    return display_frame(report.records)


def build_report(records: list[dict]) -> Report:
    """A Report of bench records: `frame` has one numeric row per run (raw samples stay in the
    records); rendered as text, Markdown or LaTeX it is the course's table (mean ± std per phase,
    failed rows numbered with their reason)."""
    records = latest_view([r for r in records if r["kind"] == "bench"])
    findings = []
    ok = [r for r in records if r["status"] == "ok"]
    if ok:
        steps = {r["metrics"]["step_ms"]["n"] for r in ok}
        findings.append("times are mean ± std over " + "/".join(map(str, sorted(steps)))
                        + " timed steps per run (raw samples in each record)")
        pooled = [r for r in ok if r.get("rounds")]
        if pooled:
            spreads = [r["metrics"]["step_ms"]["round_spread"] for r in pooled]
            findings.append(f"{len(pooled)} run(s) pooled over {pooled[0]['rounds']} interleaved "
                            f"rounds (times over all rounds' samples); the step median moved "
                            f"{min(spreads):.1%} to {max(spreads):.1%} between rounds")
    device = (ok or records or [{}])[0].get("env", {}).get("device_name", "")
    return Report(kind="bench", frame=records_frame(records), findings=findings, records=records,
                  title=f"lmperf bench on {device}" if device else "lmperf bench",
                  display=_display)


def summary_line(record: dict) -> str:
    """One line for a finished run: step time, throughput, or why it did not run."""
    status = record["status"]
    if status != "ok":
        return f"{status}: {record.get('message', '')}"
    m = record["metrics"]
    step = m["step_ms"]
    return (f"step {step['median']:.2f} ms median ({step['mean']:.2f} ± {step['std']:.2f} mean ± std, "
            f"n={step['n']}), {m['tokens_per_s']:,.0f} tokens/s")
