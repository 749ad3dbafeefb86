"""From memory records back to what the tables are made of: phase rows, saved-tensor summaries,
estimates and checkpoint rows. The report and the plot are built from records alone, so that
`lmperf table results/memory.jsonl` shows what the run showed (records written before jobs
existed read the same way; fields they lack leave their cells empty)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from lmperf.errors import SpecError
from lmperf.questions.memory.checkpointing import CheckpointRow
from lmperf.validate import checkpoint_order
from lmperf.questions.memory.estimate import MemoryEstimate, estimate
from lmperf.questions.memory.phases import PhaseRow
from lmperf.workload.spec import RunSpec

_RUN_FIELDS = {f.name for f in fields(RunSpec)}


def of(records: list[dict], analysis: str) -> list[dict]:
    """The records of one analysis ('phases', 'saved', 'estimate', 'checkpoint')."""
    return [r for r in records if r["spec"].get("analysis") == analysis]


def memory_kind(record: dict) -> str:
    """'cuda_allocator' or 'cpu_process_peak_rss': the record's, else its device's."""
    kind = ((record.get("metrics") or {}).get("memory") or {}).get("kind")
    if kind:
        return kind
    return "cuda_allocator" if record["spec"].get("device") == "cuda" else "cpu_process_peak_rss"


def is_job_record(record: dict) -> bool:
    """Whether the record stands for a whole job (the launcher's row for a child that died,
    timed out or left no result): its spec is the job's, with every context it had."""
    return "contexts" in record["spec"]


def context_of(record: dict) -> int | None:
    """The record's context length; for a job's record its only context (None if several)."""
    spec = record["spec"]
    if is_job_record(record):
        return spec["contexts"][0] if len(spec["contexts"]) == 1 else None
    return spec.get("context")


def run_spec(record: dict) -> RunSpec | None:
    """The RunSpec of a record (its analysis fields dropped); None when it no longer builds."""
    try:
        spec = {k: v for k, v in record["spec"].items() if k in _RUN_FIELDS}
        if context_of(record) is not None:
            spec["context"] = context_of(record)
        return RunSpec.from_dict(spec)
    except (SpecError, TypeError):
        return None


def estimate_for(record: dict, mode: str | None = None) -> MemoryEstimate | None:
    """The analytic estimate of a record's spec (reference LM only; allocates nothing)."""
    spec = run_spec(record)
    if spec is None or spec.model is not None:
        return None
    try:
        return estimate(spec.model_config(), spec.batch, spec.context,
                        spec.precision, spec.attention, mode or spec.mode, device=spec.device)
    except SpecError:
        return None


def phase_rows(records: list[dict]) -> list[PhaseRow]:
    """One PhaseRow per 'phases' record with a context (in record order)."""
    rows = []
    for r in of(records, "phases"):
        if is_job_record(r):
            continue
        m = r.get("metrics") or {}
        rows.append(PhaseRow(r["spec"]["precision"], context_of(r), r["spec"]["mode"],
                             r["status"], memory_kind(r), m.get("start") or {},
                             (m.get("memory") or {}).get("phases") or {}, m.get("held") or {},
                             r.get("message", ""), r.get("params")))
    return rows


def phase_estimates(records: list[dict]) -> dict[tuple[str, int, str], MemoryEstimate]:
    """(precision, context, mode) -> the estimate of each 'phases' record (reference LM)."""
    out = {}
    for r in of(records, "phases"):
        est = None if is_job_record(r) else estimate_for(r)
        if est is not None:
            out[(r["spec"]["precision"], context_of(r), r["spec"]["mode"])] = est
    return out


def baseline(records: list[dict]) -> float | None:
    """The runtime's share before any model was built (MiB), from the first phases record."""
    return next((r["metrics"].get("baseline_mib") for r in of(records, "phases")
                 if r["status"] == "ok" and r.get("metrics")), None)


@dataclass
class SavedSummary:
    """What a 'saved' record holds: bytes of one forward's saves (see memory/saved.py)."""

    precision: str
    context: int
    activation_bytes: int
    weight_copy_bytes: int
    residual_bytes: int
    measured_on: str
    per_group: dict[str, int]
    groups: list[dict]  # rows of SavedReport.by_group() (absent in older records)
    top: list[dict]
    square_bytes: int | None  # T x T activations (absent in older records)
    estimate: MemoryEstimate | None
    block: dict | None = None  # the first block: top ops, gradient bytes (absent in older records)

    def block_bytes(self) -> dict[str, int]:
        """Activation bytes of each Transformer block (groups named `<list>.<index>`)."""
        return {g: b for g, b in self.per_group.items()
                if "." in g and g.rsplit(".", 1)[1].isdigit()}


def saved(records: list[dict]) -> dict[tuple[str, int], SavedSummary]:
    """(precision, context) -> SavedSummary for every ok 'saved' record."""
    out = {}
    for r in of(records, "saved"):
        if r["status"] != "ok" or not r.get("metrics"):
            continue
        s = r["metrics"]["saved"]
        t = context_of(r)
        out[(r["spec"]["precision"], t)] = SavedSummary(
            r["spec"]["precision"], t, s["activation_bytes"], s.get("weight_copy_bytes", 0),
            s.get("residual_bytes", 0), s.get("measured_on", ""), s.get("per_group") or {},
            s.get("groups") or [], s.get("top") or [], s.get("square_bytes"),
            estimate_for(r, "train-step"), s.get("block"))
    return out


def checkpoint_rows(records: list[dict]) -> dict[tuple[str, int], list[CheckpointRow]]:
    """(precision, context) -> the trade-off rows of the 'checkpoint' records, 'none' first."""
    out: dict[tuple[str, int], list[CheckpointRow]] = {}
    for r in of(records, "checkpoint"):
        if is_job_record(r):
            continue
        m = r.get("metrics") or {}
        row = CheckpointRow(r["spec"]["checkpoint_group"], m.get("saved_bytes"),
                            m.get("expected_saved_bytes"), m.get("recompute_bytes"),
                            m.get("peak_mib"), m.get("start_mib"),
                            m.get("memory_kind") or memory_kind(r), m.get("step_ms"),
                            m.get("saved_measured_on", ""), r["status"], r.get("message", ""))
        out.setdefault((r["spec"]["precision"], context_of(r)), []).append(row)
    return {k: sorted(v, key=lambda row: checkpoint_order(row.group)) for k, v in out.items()}
