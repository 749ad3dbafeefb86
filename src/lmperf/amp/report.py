"""`lmperf amp all`: every experiment on this device, one Markdown report with tables and plots."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from lmperf.amp import EXPERIMENT_NAMES, get_experiment
from lmperf.amp.base import render
from lmperf.amp.runner import Outcome, run_experiment


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
