"""The amp Report (rebuilt from records), and `lmperf amp all`'s Markdown report with plots."""

from __future__ import annotations

from pathlib import Path

from lmperf.core.report import Report
from lmperf.questions.amp import get_experiment


def build_report(records: list[dict]) -> Report:
    """A Report of amp records. One record: `frame` is its first table and `tables` the others;
    several: `frame` has one row per experiment (status, seconds, message) and `tables` every
    table, named "experiment: title". Findings are the experiments' findings."""
    import pandas as pd

    records = [r for r in records if r["kind"] == "amp"]
    tables: dict[str, pd.DataFrame] = {}
    findings: list[str] = []
    for r in records:
        metrics = r.get("metrics") or {}
        name = r["spec"].get("experiment", "?")
        for title, rows in (metrics.get("tables") or {}).items():
            tables[title if len(records) == 1 else f"{name}: {title}"] = pd.DataFrame(rows)
        findings += [n if len(records) == 1 else f"{name}: {n}" for n in metrics.get("notes") or []]
        if r["status"] != "ok":
            findings.append(f"{name}: {r['status']}: {r.get('message', '')}")
    if len(records) == 1 and tables:
        title, frame = next(iter(tables.items()))
        del tables[title]
        return Report(kind="amp", frame=frame, tables=tables, findings=findings, records=records,
                      title=f"amp {records[0]['spec'].get('experiment')}: {title}",
                      headline=findings[:1])  # each experiment puts its answer first
    frame = pd.DataFrame([{"experiment": r["spec"].get("experiment"), "status": r["status"],
                           "seconds": (r.get("metrics") or {}).get("seconds"),
                           "tables": len((r.get("metrics") or {}).get("tables") or {}),
                           "message": r.get("message", "")} for r in records])
    ok = sum(r["status"] == "ok" for r in records)
    seconds = sum(float((r.get("metrics") or {}).get("seconds") or 0) for r in records)
    return Report(kind="amp", frame=frame, tables=tables, findings=findings, records=records,
                  title="precision lab experiments",
                  headline=[f"{ok} of {len(records)} experiments ran ok in {seconds:.1f} s"
                            + "".join(f"; {r['spec'].get('experiment')}: {r['status']}"
                                      for r in records if r["status"] != "ok")] if records else [])


def write_markdown(records: list[dict], report_dir: Path) -> Path:
    """`report_dir/report.md`: every experiment's tables and findings (rebuilt from its record)
    and its plot, in `lmperf amp all`'s order; returns its path."""
    import pandas as pd

    report_dir.mkdir(parents=True, exist_ok=True)
    env = records[0].get("env") or {} if records else {}
    lines = [
        "# lmperf precision lab",
        "",
        f"Measured on {env.get('device_name', env.get('device'))} ({env.get('device')}) with torch "
        f"{env.get('torch')}, lmperf {env.get('lmperf')} ({env.get('git_commit') or 'no git commit'}), "
        f"{env.get('timestamp')}. Every number below was computed on this run.",
        "",
    ]
    for r in records:
        name = r["spec"].get("experiment", "?")
        metrics = r.get("metrics") or {}
        seconds = metrics.get("seconds")
        lines += [f"## {name}", "", get_experiment(name).SUMMARY, ""]
        lines += [f"_{seconds:.1f} s_", ""] if isinstance(seconds, (int, float)) else []
        if r["status"] != "ok":
            lines += [f"**{r['status']}:** {r.get('message', '')}", ""]
            continue
        tables = {t: pd.DataFrame(rows) for t, rows in (metrics.get("tables") or {}).items()}
        lines.append(Report(kind="amp", tables=tables,
                            findings=list(metrics.get("notes") or [])).render("markdown"))
        plot = metrics.get("plot")
        if plot and Path(plot).exists():
            lines += [f"![{name}]({Path(plot).name})", ""]
    path = report_dir / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
