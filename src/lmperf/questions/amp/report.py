"""The amp Report (rebuilt from records), and `lmperf amp all`'s Markdown report with plots."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from lmperf.questions.amp import EXPERIMENT_NAMES, get_experiment
from lmperf.questions.amp.base import render
from lmperf.questions.amp.runner import Outcome, run_experiment
from lmperf.core.report import Report


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
                      title=f"amp {records[0]['spec'].get('experiment')}: {title}")
    frame = pd.DataFrame([{"experiment": r["spec"].get("experiment"), "status": r["status"],
                           "seconds": (r.get("metrics") or {}).get("seconds"),
                           "tables": len((r.get("metrics") or {}).get("tables") or {}),
                           "message": r.get("message", "")} for r in records])
    return Report(kind="amp", frame=frame, tables=tables, findings=findings, records=records,
                  title="precision lab experiments")


def run_all(device: torch.device, report_dir: Path,
            on_done: Callable[[Outcome], None] | None = None) -> tuple[Path, list[Outcome]]:
    """Run every experiment with its defaults, write `report_dir/report.md` and its PNGs.

    Returns the report's path and the outcomes (in order). `on_done` is called after each one.
    """
    report_dir.mkdir(parents=True, exist_ok=True)
    outcomes = []
    for name in EXPERIMENT_NAMES:
        has_plot = hasattr(get_experiment(name), "plot")
        outcome = run_experiment(name, device, plot_path=report_dir / f"{name}.png" if has_plot else None)
        outcomes.append(outcome)
        if on_done:
            on_done(outcome)
    path = report_dir / "report.md"
    path.write_text(_markdown(device, outcomes), encoding="utf-8")
    return path, outcomes


def _markdown(device: torch.device, outcomes: list[Outcome]) -> str:
    env = outcomes[0].record["env"] if outcomes else {}
    lines = [
        "# lmperf precision lab",
        "",
        f"Measured on {env.get('device_name', device.type)} ({device.type}) with torch "
        f"{env.get('torch')}, lmperf {env.get('lmperf')} ({env.get('git_commit') or 'no git commit'}), "
        f"{env.get('timestamp')}. Every number below was computed on this run.",
        "",
    ]
    for o in outcomes:
        module = get_experiment(o.name)
        lines += [f"## {o.name}", "", module.SUMMARY, "", f"_{o.seconds:.1f} s_", ""]
        if o.result is None:
            lines += [f"**failed:** {o.record['message']}", ""]
            continue
        lines.append(render(o.result, "markdown"))
        if o.plot_path is not None:
            lines += [f"![{o.name}]({o.plot_path.name})", ""]
    return "\n".join(lines)
