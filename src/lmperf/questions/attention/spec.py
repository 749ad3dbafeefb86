"""AttnSpec (the frozen identity of one attention measurement), suites, and grid expansion.
Older records' field names (impl, seq, repeats) are migrated on read: docs/migration.md."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import ClassVar, Sequence

from lmperf.errors import SpecError
from lmperf.results.schema import SpecDict
from lmperf.validate import check_fields, choice, non_negative_int, positive_int

DTYPES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}  # name -> bytes per element
DEVICES: tuple[str, ...] = ("cpu", "cuda")


@dataclass(frozen=True)
class AttnSpec(SpecDict):
    """One attention configuration on q, k, v of shape (batch, heads, context, d).

    Attributes:
        attention: implementation name (`lmperf.kernels.NAMES`; --attention).
        batch, heads, context, d: the shape of q, k and v (context: --context).
        dtype: 'fp32', 'bf16' or 'fp16' (q, k, v and the output; no autocast; --dtype).
        causal: whether query i sees keys 0..i only.
        warmup, steps: untimed calls, then timed calls per measured pass (steps: --steps).
        device: 'cpu' or 'cuda' (already resolved from 'auto').
        seed: seeds q, k, v and the output gradient.
        threads: torch's intra-op CPU threads for the run (0: torch's default); the launcher
            sets them (`lmperf.core.launch`).
    """

    kind: ClassVar[str] = "attention"
    runner: ClassVar[str] = "lmperf.questions.attention.job:run_spec"
    drop_unknown = True  # `from_dict`: fields an older record lacks take their defaults

    attention: str
    context: int
    d: int = 64
    batch: int = 1
    heads: int = 1
    dtype: str = "fp32"
    causal: bool = True
    warmup: int = 2
    steps: int = 5
    device: str = "cpu"
    seed: int = 0
    threads: int = 0

    def __post_init__(self) -> None:
        from lmperf.kernels import NAMES

        choice("attention implementation", self.attention, NAMES)
        check_fields(self, choices={"dtype": DTYPES, "device": DEVICES},
                     positive=("context", "d", "batch", "heads", "steps"),
                     non_negative=("threads", "warmup"))
        if not isinstance(self.causal, bool):
            raise SpecError(f"causal must be true or false, got {self.causal!r}")

    def score_matrix_bytes(self) -> int:
        """Analytic bytes of ONE (batch, heads, context, context) score or probability matrix in `dtype`.

        Naive attention materialises at least the probabilities for backward; FlashAttention
        never holds more than a tile of them.
        """
        return self.batch * self.heads * self.context * self.context * DTYPES[self.dtype]

    def qkv_bytes(self) -> int:
        """Bytes of one of q, k, v or o: batch * heads * context * d * element bytes."""
        return self.batch * self.heads * self.context * self.d * DTYPES[self.dtype]

    def label(self) -> str:
        """Short name for progress lines."""
        mask = "causal" if self.causal else "full"
        return (f"{self.attention} context={self.context} d={self.d} b={self.batch} h={self.heads} "
                f"{self.dtype} {mask}")


@dataclass(frozen=True)
class Suite:
    """A named grid of the course, with its full (GPU) values and a CPU-sized version."""

    name: str
    summary: str
    impls: Sequence[str]
    batch: int
    heads: int
    d: Sequence[int]
    context: Sequence[int]
    dtypes: Sequence[str]
    causal: bool
    cpu: dict  # overrides of the fields above for the CPU default


# The course's two sweeps (CS336 assignment 2): `pytorch_attention` times the naive attention
# and its torch.compile'd version at batch 8 without heads; `flash_benchmarking` compares the
# FlashAttention-2 implementations with the others at batch 1, causal.
SUITES: dict[str, Suite] = {
    "flash": Suite(
        name="flash", summary="flash_benchmarking: batch 1, causal, context 128..65536, d 16..128",
        impls=("naive", "compiled", "flash-torch", "flash-triton", "sdpa"), batch=1, heads=1,
        d=(16, 32, 64, 128), context=tuple(2**i for i in range(7, 17)), dtypes=("bf16", "fp32"),
        causal=True,
        # Seq 1024 and 2048 are where the memory criterion is judged; the whole default takes
        # about a minute on a 2-core CPU.
        cpu=dict(impls=("naive", "sdpa", "flash-torch"), d=(64,), context=(128, 256, 512, 1024, 2048),
                 dtypes=("fp32",))),
    "pytorch": Suite(
        name="pytorch", summary="pytorch_attention: batch 8, one head, d 16..128, context 256..16384",
        impls=("naive", "compiled"), batch=8, heads=1, d=(16, 32, 64, 128),
        context=(256, 1024, 4096, 8192, 16384), dtypes=("fp32",), causal=False,
        cpu=dict(impls=("naive", "sdpa"), d=(16, 64), context=(256, 1024))),
}

# On the CPU these are left out of a suite's default (they run when named with --attention):
# torch.compile spends tens of seconds compiling in every fresh child process, and Triton runs
# only through its interpreter, far too slowly for a benchmark.
CPU_OPT_IN: dict[str, str] = {
    "compiled": "torch.compile takes tens of seconds per configuration (each runs in a fresh process)",
    "flash-triton": "Triton runs on the CPU only through its interpreter (TRITON_INTERPRET=1), "
                    "orders of magnitude slower than a GPU; its timings mean nothing",
}


@dataclass(frozen=True)
class Plan:
    """The specs to run and what the user should know about how they were chosen."""

    specs: list[AttnSpec]
    notes: list[str]


def _pick(value: Sequence | None, default: Sequence) -> list:
    return list(value) if value else list(default)


def plan_sweep(suite: str, device: str, *, impls: Sequence[str] | None = None,
               seqs: Sequence[int] | None = None, ds: Sequence[int] | None = None,
               dtypes: Sequence[str] | None = None, batch: int | None = None,
               heads: int | None = None, causal: bool | None = None, warmup: int = 2,
               steps: int = 5, seed: int = 0, threads: int = 0) -> Plan:
    """Expand a suite (scaled to `device` unless overridden) into checked AttnSpecs.

    Every explicit argument replaces the suite's value; None keeps it. Order: dtype, d, attention,
    context (so each table reads down the sequence length). Raises SpecError on bad input, naming
    the command line's option.
    """
    choice("suite", suite, SUITES)
    _check_flags(seqs=seqs, ds=ds, dtypes=dtypes, batch=batch, heads=heads, warmup=warmup,
                 steps=steps, threads=threads)
    s = SUITES[suite]
    base = {"impls": s.impls, "d": s.d, "context": s.context, "dtypes": s.dtypes, "batch": s.batch,
            "heads": s.heads}
    notes = []
    if device == "cpu":
        base.update(s.cpu)
        notes.append(f"suite {suite} ({s.summary}) scaled to the CPU: "
                     + ", ".join(f"{k} {' '.join(map(str, base[k]))}"
                                 for k in ("impls", "d", "context", "dtypes"))
                     + "; override with --attention/--d/--context/--dtype")
        if not impls:
            left_out = [n for n in s.impls if n in CPU_OPT_IN]
            for n in left_out:
                notes.append(f"{n} is opt-in on the CPU (--attention {n}): {CPU_OPT_IN[n]}")
    specs = [
        AttnSpec(attention=i, context=t, d=d, batch=base["batch"] if batch is None else batch,
                 heads=base["heads"] if heads is None else heads,
                 dtype=dt, causal=s.causal if causal is None else causal, warmup=warmup,
                 steps=steps, device=device, seed=seed, threads=threads)
        for dt, d, i, t in itertools.product(_pick(dtypes, base["dtypes"]), _pick(ds, base["d"]),
                                             dict.fromkeys(_pick(impls, base["impls"])),
                                             sorted(set(_pick(seqs, base["context"]))))
    ]
    return Plan(specs, notes)


def _check_flags(*, seqs: Sequence[int] | None, ds: Sequence[int] | None,
                 dtypes: Sequence[str] | None, batch: int | None, heads: int | None,
                 warmup: int, steps: int, threads: int) -> None:
    """SpecError naming the flag (--context, not the spec's field context) for a bad value."""
    for flag, values in (("--context", seqs), ("--d", ds), ("--batch", [batch]),
                         ("--heads", [heads]), ("--steps", [steps])):
        for v in values or []:
            if v is not None:
                positive_int(flag, v)
    non_negative_int("--warmup", warmup)
    non_negative_int("--threads", threads)
    for dt in dtypes or []:
        if dt not in DTYPES:
            raise SpecError(f"--dtype: unknown dtype {dt!r}; accepted: {', '.join(DTYPES)}")
