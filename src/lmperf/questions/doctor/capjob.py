"""The memory-cap check: a job that cannot fit under its cap must come back as an 'oom' row.

It goes through the machinery every capped run uses (`core.launch.ChildProcess` with
`--max-memory-gib`, `runtime.device.cap_memory`, `core.outcome.failure`). The job allocates a
little, then more than the cap allows; the check passes only when the large allocation is the
one that failed (the message alone, "out of memory while ...", would pass a cap that broke the
child at its first allocation). On the CPU the cap (RLIMIT_AS) counts everything mapped, so it
is sized from what an uncapped child maps after import (`core.capfloor`) plus `HEADROOM_GIB`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, ClassVar

from lmperf.questions.doctor.checks import Context, Outcome, passed
from lmperf.results.schema import SpecDict
from lmperf.units import GIB, MIB

KIND = "doctor"
CAP_GIB = {"cuda": 1.0}
"""The CUDA cap (the caching allocator's fraction: nothing else counts against it)."""
HEADROOM_GIB = 1.0
"""On the CPU: the cap is the child's address space after import plus this."""
ALLOC_GIB = {"cpu": 2 * HEADROOM_GIB, "cuda": 2.0}
"""What the job then tries to allocate and touch: well over what the cap leaves."""
SMALL_MIB = 64


@dataclass(frozen=True)
class AllocSpec(SpecDict):
    """A job that allocates `gib` GiB on `device` after a small allocation that must succeed."""

    kind: ClassVar[str] = KIND
    runner: ClassVar[str] = "lmperf.questions.doctor.capjob:run_alloc"

    device: str
    gib: float
    threads: int = 1

    def label(self) -> str:
        """A short name for messages."""
        return f"allocate {self.gib:g} GiB on {self.device}"


def run_alloc(spec: AllocSpec) -> dict:
    """Allocate SMALL_MIB, then `spec.gib` GiB (every page touched; nothing when 0) on the spec's
    device; return the record ('ok' when both fit, else what `core.outcome.failure` decides).

    The record says which allocation failed (`failed_at`: 'small' / 'large', None when both
    fitted) and the process's address space before the first one (`address_space_gib`).
    """
    import torch

    from lmperf.core.outcome import Stage, failure
    from lmperf.results.schema import make_record
    from lmperf.runtime import device as dev
    from lmperf.runtime import env as envmod

    device = torch.device(spec.device)
    environment = envmod.capture(device)
    mapped = dev.address_space_bytes()
    seen = {"address_space_gib": mapped / GIB if mapped is not None else None}
    stage, failed_at = Stage(f"allocating {SMALL_MIB} MiB"), "small"
    try:
        small = torch.ones(SMALL_MIB * MIB, dtype=torch.uint8, device=device)
        stage.now, failed_at = f"allocating {spec.gib:g} GiB", "large"
        big = torch.empty(int(spec.gib * GIB), dtype=torch.uint8, device=device)
        big.fill_(1)  # touch every page: a lazily mapped CPU buffer must really be resident
        total = int(small.sum().item()) + (int(big[:1].item()) if big.numel() else 0)
        return make_record(KIND, spec.to_dict(), "ok", environment, metrics={"touched": total},
                           failed_at=None, **seen)
    except Exception as exc:  # noqa: BLE001 - the decision oom / error is the point
        fields = failure(exc, stage)
        return make_record(KIND, spec.to_dict(), fields.pop("status"), environment,
                           failed_at=failed_at, **seen, **fields)


def start_cap_job(ctx: Context) -> Callable[[], list[dict]]:
    """The launch: run the capped child (seconds: it imports torch). On the CPU the cap is what
    an uncapped child maps after import (`core.capfloor.floor_bytes`, measured once and cached)
    plus HEADROOM_GIB, rounded up to 1/16 GiB."""
    from lmperf.core.capfloor import floor_bytes
    from lmperf.core.launch import ChildProcess

    kind = ctx.device.type
    spec = AllocSpec(device=kind, gib=ALLOC_GIB[kind])
    if kind != "cpu":
        return ChildProcess(spec, timeout_s=120, max_memory_gib=CAP_GIB[kind]).run

    def sized() -> list[dict]:
        floor = floor_bytes(warm=False)  # the launch below is a cold ChildProcess too
        if floor is None:
            return [{"status": "error", "message": "the address space of an uncapped child "
                                                   "could not be read: no cap to size"}]
        cap = math.ceil((floor / GIB + HEADROOM_GIB) * 16) / 16
        return ChildProcess(spec, timeout_s=120, max_memory_gib=cap).run()

    return sized


def check_cap(ctx: Context) -> Outcome:
    """The capped child's record must be 'oom' at the large allocation (the small one fitted)
    and carry its cap."""
    kind = ctx.device.type
    records = ctx.result_of(start_cap_job)
    record = records[0] if records else {}
    status, message = record.get("status"), " ".join(str(record.get("message", "")).split())
    failed_at = record.get("failed_at")
    cap = str(record.get("memory_cap", "no cap recorded"))
    how = cap[cap.find("(") + 1:cap.find(")")] if "(" in cap else cap
    where = {"large": f"at the {ALLOC_GIB[kind]:g} GiB allocation",
             "small": f"already at the {SMALL_MIB} MiB allocation"}.get(failed_at, "")
    result = f"{status} row {where}: {message.split(': ')[0][:80]} ({cap.split(' (')[0]}, {how})"
    return passed(status == "oom" and failed_at == "large" and "memory_cap" in record,
                  result, f"a job over its cap must be an 'oom' row at its large allocation, "
                          f"after a {SMALL_MIB} MiB one fitted, with its cap",
                  status=status, message=message, failed_at=failed_at, memory_cap=cap,
                  address_space_gib=record.get("address_space_gib"), alloc_gib=ALLOC_GIB[kind])
