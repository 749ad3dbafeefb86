"""One section of the write-up per kind of record: its tables (as its question lays them out),
findings, failed runs with their reason, warnings and the environment the records were measured
in. Everything here is already text for reading; the renderers (html, markdown) only escape and
lay it out, and the plots are drawn by `lmperf.questions.writeup.plots`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pandas as pd

# One cell format for every renderer: the HTML page shows the same digits as `lmperf table`.
from lmperf.core.report import Report, header, numbered, readable

STATUSES: tuple[str, ...] = ("ok", "oom", "error", "unsupported")
# What a section's numbers are, said above its tables (never "measured" over a prediction).
BASES: dict[str, str] = {"measured": "MEASURED in the runs named below ('estimate' columns: "
                                     "the estimate beside the measurement).",
                         "estimated": "ESTIMATED: simulated, nothing ran (docs/accuracy.md).",
                         "predicted": "PREDICTED: modelled for the device named, nothing ran "
                                      "(docs/accuracy.md)."}
NUMBER_LIKE = re.compile(r"[-+]?[\d.,]+(e[-+]?\d+)?%?( ± [\d.,]+(e[-+]?\d+)?)?( / [\d.,]+)?|-")
MAX_ROWS = 60  # rows of a secondary table shown on the page; the rest is in the records

# Spec fields that name a run, in the order a label reads, with their short prefix ("" = bare).
KEY_FIELDS: tuple[tuple[str, str], ...] = (
    ("experiment", ""), ("analysis", ""), ("attention", ""), ("model", ""), ("size", ""),
    ("context", "ctx="), ("batch", "b="), ("precision", ""), ("dtype", ""), ("mode", ""),
)
# Fields that follow from a size preset: naming them again would only lengthen the label.
DERIVED: frozenset[str] = frozenset({"d_model", "num_layers", "num_heads", "d_ff",
                                     "model_context", "vocab_size", "rope_theta"})
# Environment fields that identify where a run was measured; timestamp and load vary per run.
ENV_FIELDS: tuple[tuple[str, str], ...] = (
    ("hostname", "host"), ("device", "device"), ("device_name", "device name"),
    ("cpu_count", "CPUs"), ("torch_threads", "torch threads"), ("python", "python"),
    ("torch", "torch"), ("cuda", "CUDA"), ("cudnn", "cuDNN"), ("lmperf", "lmperf"),
    ("git_commit", "git commit"), ("float32_matmul_precision", "fp32 matmul"),
)


@dataclass
class Table:
    """A table ready to read: string cells, a caption and notes printed under it."""

    title: str
    frame: pd.DataFrame
    caption: str = ""
    notes: list[str] = field(default_factory=list)
    numeric: frozenset[str] = frozenset()  # columns that held numbers (right-aligned)
    hidden_rows: int = 0  # rows left out of the page (still in the records)


@dataclass
class Plot:
    """One figure: PNG bytes, or None with `note` saying why it is not drawn."""

    title: str
    png: bytes | None
    note: str = ""


@dataclass
class Section:
    """Everything the write-up shows for one kind of record."""

    kind: str
    title: str
    counts: dict[str, int]
    tables: list[Table]
    findings: list[str]
    failures: Table
    warnings: Table
    environment: Table
    plots: list[Plot] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # remarks on the section (load, plots)
    basis: str = "measured"  # a key of BASES
    anchor: str = ""  # the section's fragment id (the kind's, where it has one section)


def basis(record: dict) -> str:
    """What a record's numbers are: 'predicted' (bench --predict, a plan but its --confirm
    cells), 'estimated' (memory --estimate's simulated steps) or 'measured' (the rest ran)."""
    spec = record.get("spec") or {}
    if record.get("kind") == "prediction" or (record.get("kind") == "plan"
                                               and not spec.get("confirm")):
        return "predicted"
    return "estimated" if spec.get("analysis") == "estimate" else "measured"


def run_labels(records: list[dict]) -> list[str]:
    """A short name per record ("tiny ctx=16 fp32 forward"): the key fields it has, plus every
    other spec field whose value differs between the records that have it (a field that older
    records lack does not count); numbered if two names still coincide."""
    specs = [r.get("spec") or {} for r in records]
    keys = list(dict.fromkeys(k for s in specs for k in s))
    varying = [k for k in keys if k not in DERIVED
               and len({repr(s[k]) for s in specs if k in s}) > 1]
    labels = []
    for record, spec in zip(records, specs):
        # The implementation names an attention run; elsewhere it is a setting, named when it
        # varies ("attention=sdpa").
        key_fields = [(n, p) for n, p in KEY_FIELDS
                      if n != "attention" or record.get("kind") == "attention"]
        parts = []
        for name, prefix in key_fields:
            if name == "size" and spec.get("model"):
                continue  # a user model: its factory names the run, the preset does not
            if spec.get(name) not in (None, ""):
                parts.append(f"{prefix}{spec[name]}")
        key_names = {name for name, _ in key_fields}
        parts += [f"{k}={spec[k]}" for k in varying if k not in key_names and k in spec]
        labels.append(" ".join(parts) or "run")
    return numbered(labels)


def readable_table(title: str, df: pd.DataFrame, caption: str = "", notes: list[str] | None = None,
                   max_rows: int | None = None) -> Table:
    """A Table of `df` with its numbers formatted as `lmperf table` prints them; at most
    `max_rows` rows (None: all)."""
    hidden = 0
    if max_rows is not None and len(df) > max_rows:
        hidden, df = len(df) - max_rows, df.head(max_rows)
    shown = readable(df).astype(str) if not df.empty else df
    # Right-aligned and never wrapped: numbers, and the display's number-like strings
    # ("3.26 ± 0.74", "1,411,392", "+40.7%", "-").
    types = pd.api.types
    # headers read as words with their unit, as `lmperf table` prints them (`peak_gib` ->
    # "peak", `step_s` -> "step (s)"); a name two columns would share stays as it is
    names = [header(c) for c in df.columns]
    names = [n if names.count(n) == 1 else str(c) for n, c in zip(names, df.columns)]
    numeric = frozenset(n for n, c in zip(names, df.columns)
                        if (types.is_numeric_dtype(df[c]) and not types.is_bool_dtype(df[c]))
                        or (len(df) and all(NUMBER_LIKE.fullmatch(v) for v in shown[c])))
    shown.columns = names
    return Table(title, shown.reset_index(drop=True), caption, list(notes or []), numeric, hidden)


def failures_table(records: list[dict], labels: list[str]) -> Table:
    """Every run that is not ok, with its status and full reason (and a crashed child's log
    tail), so that a failed row is never only a footnote."""
    rows = []
    for r, label in zip(records, labels):
        if r["status"] == "ok":
            continue
        reason = str(r.get("message") or "(no message recorded)")
        tail = r.get("log_tail")
        if tail:
            reason += "\nlog tail:\n" + str(tail)
        rows.append({"run": label, "status": r["status"], "reason": reason})
    frame = pd.DataFrame(rows, columns=["run", "status", "reason"])
    return Table("runs that did not finish", frame)


def warnings_table(records: list[dict], labels: list[str]) -> Table:
    """The warnings the records carry (noise, caveats), one row per run and warning."""
    rows = [{"run": label, "warning": str(w)}
            for r, label in zip(records, labels) for w in (r.get("warnings") or [])]
    return Table("warnings", pd.DataFrame(rows, columns=["run", "warning"]))


def environment_table(records: list[dict]) -> tuple[Table, list[str]]:
    """(the environments the records were measured in: one column per distinct environment, one
    row per field, with its number of runs, time span and 1-minute load average range; remarks
    such as a load above the core count)."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        env = r.get("env") or {}
        groups.setdefault(tuple(repr(env.get(k)) for k, _ in ENV_FIELDS), []).append(env)
    columns, remarks = {}, []
    for i, envs in enumerate(groups.values(), start=1):
        first = envs[0]
        values = {title: "-" if first.get(k) in (None, "") else str(first.get(k))
                  for k, title in ENV_FIELDS}
        stamps = sorted(str(e["timestamp"]) for e in envs if e.get("timestamp"))
        loads = [float(e["load_average_1m"]) for e in envs
                 if isinstance(e.get("load_average_1m"), (int, float))]
        values["runs"] = str(len(envs))
        values["measured (UTC)"] = (stamps[0] if stamps[0] == stamps[-1] else
                                    f"{stamps[0]} .. {stamps[-1]}") if stamps else "-"
        values["load average (1 min)"] = (f"{min(loads):.2f}" if min(loads) == max(loads) else
                                          f"{min(loads):.2f} .. {max(loads):.2f}") if loads else "-"
        cores = first.get("cpu_count")
        if loads and isinstance(cores, int) and max(loads) > cores:
            remarks.append(f"the 1-minute load average reached {max(loads):.2f} on "
                           f"{first.get('hostname') or 'the host'} ({cores} cores): some runs "
                           "competed with other processes for the CPU")
        columns[f"environment {i}" if len(groups) > 1 else "value"] = values
    # Transposed (field per row): an environment has more fields than a page is wide.
    frame = pd.DataFrame(columns).rename_axis("field").reset_index() if columns else pd.DataFrame()
    return Table("environment", frame), remarks


def main_tables(report: Report) -> list[Table]:
    """The report's main table as its question lays it out (the course's benchmark table for
    bench: mean ± std per phase, failed rows numbered with their reason), then its other tables."""
    tables = []
    if not report.frame.empty:
        shown, caption, notes = report.main()
        if not shown.empty:  # memory lays its runs out in `tables` only
            tables.append(readable_table(report.title or report.kind, shown, caption, notes))
    for name, df in report.tables.items():
        if not df.empty:
            tables.append(readable_table(name, df, max_rows=MAX_ROWS))
    return tables


def build_section(report: Report, basis: str = "measured") -> Section:
    """The Section of one kind's Report, whose numbers are `basis` (plots are added by the
    caller); its findings open with the report's headline."""
    records = report.records
    labels = run_labels(records)
    counts = {s: sum(r["status"] == s for r in records) for s in STATUSES}
    env, remarks = environment_table(records)
    return Section(kind=report.kind, title=report.title or report.kind, counts=counts,
                   tables=main_tables(report),
                   findings=list(dict.fromkeys(report.headline + report.findings + report.more)),
                   failures=failures_table(records, labels),
                   warnings=warnings_table(records, labels), environment=env, notes=remarks,
                   basis=basis)
