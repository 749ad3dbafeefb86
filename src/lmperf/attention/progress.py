"""Progress lines of the attention sweep: bench's progress bar with attention's one-line summary."""

from __future__ import annotations

from lmperf.progress import RichReporter


def summary_line(record: dict) -> str:
    """Medians per pass and the memory before backward (MiB and in score matrices P), or why
    the configuration did not run."""
    if record["status"] != "ok":
        return f"{record['status']}: {record.get('message', '')}"
    m = record["metrics"]
    times = ", ".join(f"{name} {m[f'{p}_ms']['median']:.3g}"
                      for p, name in (("forward", "fwd"), ("backward", "bwd"), ("end_to_end", "fwd+bwd")))
    return (f"{times} ms (median of {m['forward_ms']['n']}); before backward "
            f"{m['memory']['before_backward_mib']:.2f} MiB = {m['memory']['x_score_matrix']:.2f} P")


class AttentionReporter(RichReporter):
    """A progress bar on stderr and one line per finished configuration."""

    def finish(self, index: int, spec, record: dict) -> None:
        style = {"ok": "green", "oom": "yellow", "error": "red"}.get(record["status"], "magenta")
        self.progress.console.print(f"[{style}]{record['status']:>11}[/] {spec.label()}: "
                                    f"{summary_line(record)}", highlight=False, soft_wrap=True)
        for w in record.get("warnings", []):
            self.progress.console.print(f"{'':>11}   [dim]warning: {w}[/]", highlight=False,
                                        soft_wrap=True)
        self.progress.advance(self.task)
