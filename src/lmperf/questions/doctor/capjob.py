"""The memory-cap check: a job that cannot fit under its cap must come back as an 'oom' row.

It goes through the very machinery every capped run uses: `core.launch.ChildProcess` starts
`python -m lmperf.core.child` with `--max-memory-gib`, the child caps itself
(`runtime.device.cap_memory`: RLIMIT_AS on the CPU, the caching allocator's fraction on CUDA),
runs `run_alloc`, and `core.outcome.failure` decides oom vs error. The job first allocates a
little (so a cap that breaks the child at start-up reads as an error, not a pass), then more
than the cap allows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, ClassVar

from lmperf.questions.doctor.checks import Context, Outcome, passed

KIND = "doctor"
CAP_GIB = {"cpu": 1.5, "cuda": 1.0}
"""The cap per device: the CPU's counts the ~0.6 GiB of address space Python and torch map."""
ALLOC_GIB = {"cpu": 4.0, "cuda": 2.0}
"""What the job then tries to allocate and touch: well over the cap."""
SMALL_MIB = 64


@dataclass(frozen=True)
class AllocSpec:
    """A job that allocates `gib` GiB on `device` after a small allocation that must succeed."""

    kind: ClassVar[str] = KIND
    runner: ClassVar[str] = "lmperf.questions.doctor.capjob:run_alloc"

    device: str
    gib: float
    threads: int = 1

    def to_dict(self) -> dict:
        """The spec as JSON (what the child rebuilds it from)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "AllocSpec":
        """Inverse of `to_dict`."""
        return cls(**data)

    def label(self) -> str:
        """A short name for messages."""
        return f"allocate {self.gib:g} GiB on {self.device}"


def run_alloc(spec: AllocSpec) -> dict:
    """Allocate SMALL_MIB, then `spec.gib` GiB (every page touched) on the spec's device; return
    the record ('ok' when both fit, else what `core.outcome.failure` decides)."""
    import torch

    from lmperf.core.outcome import Stage, failure
    from lmperf.results.schema import make_record
    from lmperf.runtime import env as envmod

    device = torch.device(spec.device)
    environment = envmod.capture(device)
    stage = Stage(f"allocating {SMALL_MIB} MiB")
    try:
        small = torch.ones(SMALL_MIB * 2**20, dtype=torch.uint8, device=device)
        stage.now = f"allocating {spec.gib:g} GiB"
        big = torch.empty(int(spec.gib * 2**30), dtype=torch.uint8, device=device)
        big.fill_(1)  # touch every page: a lazily mapped CPU buffer must really be resident
        total = int(small.sum().item()) + int(big[:1].item())
        return make_record(KIND, spec.to_dict(), "ok", environment, metrics={"touched": total})
    except Exception as exc:  # noqa: BLE001 - the decision oom / error is the point
        fields = failure(exc, stage)
        return make_record(KIND, spec.to_dict(), fields.pop("status"), environment, **fields)


def start_cap_job(ctx: Context) -> Callable[[], list[dict]]:
    """The background part: run the capped child (seconds: it imports torch)."""
    from lmperf.core.launch import ChildProcess

    kind = ctx.device.type
    spec = AllocSpec(device=kind, gib=ALLOC_GIB[kind])
    return ChildProcess(spec, timeout_s=120, max_memory_gib=CAP_GIB[kind]).run


def check_cap(ctx: Context, name: str) -> Outcome:
    """The capped child's record must be 'oom', carry its cap, and say out of memory."""
    kind = ctx.device.type
    records = ctx.background[name].result()
    record = records[0] if records else {}
    status, message = record.get("status"), " ".join(str(record.get("message", "")).split())
    cap = str(record.get("memory_cap", "no cap recorded"))
    how = cap[cap.find("(") + 1:cap.find(")")] if "(" in cap else cap
    result = f"{status} row: {message.split(': ')[0][:80]} (cap {CAP_GIB[kind]:g} GiB, {how})"
    return passed(status == "oom" and "out of memory" in message and "memory_cap" in record,
                  result, "a job over its cap must be an 'oom' row with its cap",
                  status=status, message=message, memory_cap=cap, cap_gib=CAP_GIB[kind],
                  alloc_gib=ALLOC_GIB[kind])
