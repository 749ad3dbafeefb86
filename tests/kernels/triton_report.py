"""Compile the flash-triton kernels for sm_80 and sm_90 without a GPU and report their resources.

    .venv/bin/python -m tests.kernels.triton_report             # the table, as launched today
    .venv/bin/python -m tests.kernels.triton_report --baseline  # the tiles before issue 11
    .venv/bin/python -m tests.kernels.triton_report --compare   # before -> after, one table
    .venv/bin/python -m tests.kernels.triton_report --json      # one JSON object per kernel
    .venv/bin/python -m tests.kernels.triton_report --search    # and every config a search keeps

Triton compiles a kernel for a GPUTarget it is given (`triton.compile(ASTSource(...), target=...)`)
with the ptxas that ships in its wheel (triton/backends/nvidia/bin; `ptxas-blackwell` for sm_90),
so nothing here needs a GPU. Per kernel it reads: shared memory from the compiled kernel's
metadata (`metadata.shared`, bytes per block, what Triton checks against the device at launch);
registers and stack frame (bytes of local memory per thread) from `cuobjdump -res-usage` on the
cubin; and, where the stack frame is not empty, the spill stores and loads from `ptxas -v` rerun
on the same PTX with Triton's flags. (`CompiledKernel.n_regs` / `n_spills` exist only after the
driver has loaded the kernel, on a GPU.)

Compiling must happen with TRITON_INTERPRET unset from the start of the process (Triton decides
at import whether its own helpers are interpreted), which is why the tests run this module in a
child process. Compiled kernels land in Triton's cache (TRITON_CACHE_DIR, default
~/.triton/cache), so only the first run pays the compilation.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from lmperf.kernels.flash_configs import TileConfig

TARGETS = {"sm_80": 80, "sm_90": 90}
SHARED_LIMIT_BYTES = {"sm_80": 163 * 1024, "sm_90": 227 * 1024}
"""Most shared memory one block may opt in to: 163 KiB on compute capability 8.0 (A100: 164 KiB
per SM, 1 KiB kept by CUDA; Triton's OutOfResources reports "Hardware limit: 166912" there) and
227 KiB on 9.0 (H100: 228 KiB per SM). Other 8.x parts (8.6, 8.9) allow only 99 KiB."""
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
HEAD_DIMS = (64, 128)
KERNEL_NAMES = {"fwd": "_fwd_kernel", "dkdv": "_bwd_dkdv_kernel", "dq": "_bwd_dq_kernel",
                "delta": "_bwd_delta_kernel"}


@dataclass(frozen=True)
class Case:
    """One compilation: a kernel for a target, input dtype, head dim and causality, with the
    launch's default configuration or one its search may try (`tiles`)."""

    kernel: str  # a key of KERNEL_NAMES
    target: str  # a key of TARGETS
    dtype: str  # a key of DTYPES
    head_dim: int
    causal: bool  # the delta kernel has no mask: always False
    tiles: TileConfig | None = None  # None: flash_configs.default_config

    def config(self) -> TileConfig:
        """The configuration this case compiles."""
        from lmperf.kernels.flash_configs import default_config

        return self.tiles or default_config(self.kernel, DTYPES[self.dtype], self.head_dim)


CONTROL = (Case("dq", "sm_80", "bf16", 64, True), 32)
"""A kernel capped at 32 registers per thread (ptxas .maxnreg; it needs ~190): it must spill,
which shows that the measurement sees a spill when there is one."""


@dataclass(frozen=True)
class Row:
    """What one compilation uses: the launch choice and the resources ptxas assigned."""

    kernel: str
    target: str
    dtype: str
    head_dim: int
    causal: bool
    block_q: int
    block_k: int
    num_warps: int
    num_stages: int
    registers: int  # per thread
    stack_bytes: int  # local-memory stack frame per thread (spills + local arrays)
    spill_store_bytes: int
    spill_load_bytes: int
    shared_bytes: int  # dynamic shared memory per block
    shared_limit_bytes: int
    compile_s: float  # wall time of this compilation (near 0 when it came from Triton's cache)


def unavailable_reason() -> str | None:
    """Why the kernels cannot be compiled for an NVIDIA target here, or None when they can."""
    if os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on"):
        return "TRITON_INTERPRET is set: Triton compiles nothing in this process"
    try:
        import triton  # noqa: F401
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.backends.nvidia.compiler import get_ptxas
        from triton.knobs import nvidia
    except ImportError as e:
        return f"Triton with its NVIDIA backend is not installed ({e})"
    try:
        for cc in TARGETS.values():
            get_ptxas(cc).path
        nvidia.cuobjdump.path
    except RuntimeError as e:  # the knob raises when no binary answers --version
        return f"this Triton cannot target NVIDIA GPUs here: {e}"
    return None


def cases(search: bool = False) -> list[Case]:
    """The defaults' matrix: fwd, dkdv, dq x target x dtype x d x causal; delta x target x dtype
    x d. With `search`, also every configuration the search keeps on each target (its shared
    memory) for the shapes of issue 37: bf16, d 64 and 128, causal."""
    from lmperf.kernels.flash_configs import KERNELS, candidates

    out = []
    for kernel in KERNEL_NAMES:
        for target in TARGETS:
            for dtype in DTYPES:
                for d in HEAD_DIMS:
                    for causal in ((False,) if kernel == "delta" else (False, True)):
                        out.append(Case(kernel, target, dtype, d, causal))
    defaults = {(c.kernel, c.target, c.dtype, c.head_dim, c.causal, c.config()) for c in out}
    for kernel in KERNELS if search else ():
        for target in TARGETS:
            for d in HEAD_DIMS:
                for cfg in candidates(kernel, torch.bfloat16, d, SHARED_LIMIT_BYTES[target]):
                    if (kernel, target, "bf16", d, True, cfg) not in defaults:
                        out.append(Case(kernel, target, "bf16", d, True, cfg))
    return out


def baseline_config(kernel: str, dtype: torch.dtype, head_dim: int) -> TileConfig:
    """The launch choice before issue 11: 64 x 64 tiles for every kernel and dtype, 8 warps for
    d > 64 and 4 otherwise, 2 stages (the delta kernel took the same warps and stages)."""
    from lmperf.kernels.flash_configs import TileConfig

    warps = 8 if head_dim > 64 else 4
    return TileConfig(64, 64, warps, 2) if kernel != "delta" else TileConfig(64, 0, warps, 2)


# --- compiling one case ---------------------------------------------------------------------------

def _signature(kernel: str, dtype: str) -> tuple[object, dict[str, str]]:
    """(the JITFunction of `kernel`, Triton type per argument as the launcher specialises it)."""
    from lmperf.kernels import flash_triton as ft

    # Jitted as the launcher jits it, with the device functions it calls (a bare
    # JITFunction(raw kernel) would find them unjitted).
    fn = ft._kernels(False)[kernel]
    sig = {}
    for p in fn.params:
        if p.is_constexpr:
            sig[p.name] = "constexpr"
        elif p.name in ("L", "DELTA", "ITERS"):  # ITERS: L is passed unless loops are counted
            sig[p.name] = "*fp32"
        elif p.name.isupper():  # Q, K, V, O, DO, DK, DV, DQ: the inputs' dtype
            sig[p.name] = f"*{dtype}"
        elif p.name in ("qk_scale_log2", "sm_scale"):
            sig[p.name] = "fp32"
        else:  # n_q, n_k and the (batch, head, row) strides
            sig[p.name] = "i32"
    return fn, sig


def _resources(cubin: bytes) -> tuple[int, int]:
    """(registers per thread, stack frame bytes per thread) from `cuobjdump -res-usage`."""
    from triton.knobs import nvidia

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        out = subprocess.run([nvidia.cuobjdump.path, "-res-usage", path], capture_output=True,
                             text=True, check=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+)", out)
    if m is None:
        raise RuntimeError(f"cuobjdump printed no REG/STACK line:\n{out}")
    return int(m.group(1)), int(m.group(2))


def _spills(ptx: str, cc: int) -> tuple[int, int]:
    """(spill store bytes, spill load bytes) per thread from `ptxas -v` on `ptx`, run with the
    flags Triton 3.9 passes (line info, register-allocation level 2)."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        log = subprocess.run([get_ptxas(cc).path, "-lineinfo", "-v", "--regAllocOptLevel=2",
                              f"--gpu-name={sm_arch_from_capability(cc)}", src,
                              "-o", src + ".o"], capture_output=True, text=True, check=True).stderr
    m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def compile_case(case: Case, cfg: TileConfig | None = None, maxnreg: int | None = None) -> Row:
    """Compile `case` with TileConfig `cfg` (default: the case's, `Case.config`) and measure
    what it uses; `maxnreg` caps the registers per thread (a control that must spill)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from lmperf.kernels.flash_triton import launch_arguments

    dtype = DTYPES[case.dtype]
    cfg = cfg or case.config()
    # Exactly what the launcher passes on CUDA, split into constexprs and compile options.
    args = launch_arguments(case.kernel, dtype, case.head_dim, interpret=False, tiles=cfg)
    options = {"num_warps": args.pop("num_warps"), "num_stages": args.pop("num_stages"),
               "maxnreg": maxnreg}
    if case.kernel != "delta":
        args["IS_CAUSAL"] = case.causal
    if case.kernel == "fwd":
        args["RECORD_ITERS"] = False
    fn, sig = _signature(case.kernel, case.dtype)
    # Tensors from torch are 16-byte aligned and the benchmarks' n, d are multiples of 16: the
    # launcher would specialise those arguments as divisible by 16, so the compile does too.
    attrs = {(i,): [["tt.divisibility", 16]] for i, (name, ty) in enumerate(sig.items())
             if ty.startswith("*") or ty == "i32"}
    cc = TARGETS[case.target]
    start = time.perf_counter()
    kernel = triton.compile(ASTSource(fn, sig, args, attrs), target=GPUTarget("cuda", cc, 32),
                            options=options)
    seconds = time.perf_counter() - start
    registers, stack = _resources(kernel.asm["cubin"])
    stores, loads = _spills(kernel.asm["ptx"], cc) if stack else (0, 0)
    return Row(case.kernel, case.target, case.dtype, case.head_dim, case.causal, cfg.block_q,
               cfg.block_k, cfg.num_warps, cfg.num_stages, registers, stack, stores, loads,
               kernel.metadata.shared, SHARED_LIMIT_BYTES[case.target], round(seconds, 2))


def compile_all(baseline: bool = False, workers: int | None = None,
                search: bool = False) -> list[Row]:
    """Every case of `cases(search)`, compiled over `workers` processes (default: the CPUs)."""
    todo = cases(search and not baseline)
    configs = [baseline_config(c.kernel, DTYPES[c.dtype], c.head_dim) if baseline else None
               for c in todo]
    workers = workers or os.cpu_count() or 1
    if workers == 1:
        return [compile_case(c, cfg) for c, cfg in zip(todo, configs)]
    with ProcessPoolExecutor(workers) as pool:
        return list(pool.map(compile_case, todo, configs))


# --- the table ------------------------------------------------------------------------------------

def render(rows: list[Row]) -> str:
    """A markdown table: one line per kernel x target x dtype x d x causal."""
    head = ("| kernel | target | dtype | d | causal | tiles (q x k) | warps | stages | regs "
            "| stack B | spill st/ld B | shared KiB (limit) |")
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        tiles = f"{r.block_q} rows" if r.kernel == "delta" else f"{r.block_q} x {r.block_k}"
        lines.append(
            f"| {r.kernel} | {r.target} | {r.dtype} | {r.head_dim} | {'yes' if r.causal else 'no'}"
            f" | {tiles} | {r.num_warps} | {r.num_stages} | {r.registers} | {r.stack_bytes} "
            f"| {r.spill_store_bytes}/{r.spill_load_bytes} "
            f"| {r.shared_bytes / 1024:.1f} ({r.shared_limit_bytes // 1024}) |")
    return "\n".join(lines)


def render_compare(before: list[Row], after: list[Row]) -> str:
    """A markdown table of the same cases before -> after: launch, registers, stack, shared."""
    def launch(r: Row) -> str:
        tiles = f"{r.block_q} rows" if r.kernel == "delta" else f"{r.block_q}x{r.block_k}"
        return f"{tiles} w{r.num_warps} s{r.num_stages}"

    lines = ["| kernel | target | dtype | d | causal | launch | regs | stack B (spill st/ld B) "
             "| shared KiB |", "|" + "---|" * 9]
    for b, a in zip(before, after):
        lines.append(
            f"| {a.kernel} | {a.target} | {a.dtype} | {a.head_dim} | {'yes' if a.causal else 'no'}"
            f" | {launch(b)} -> {launch(a)} | {b.registers} -> {a.registers} "
            f"| {b.stack_bytes} ({b.spill_store_bytes}/{b.spill_load_bytes}) -> {a.stack_bytes}"
            f" | {b.shared_bytes / 1024:.1f} -> {a.shared_bytes / 1024:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the table (or JSON lines); exit 0, or 3 with the reason when nothing can compile."""
    ap = argparse.ArgumentParser(prog="python -m tests.kernels.triton_report",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", action="store_true",
                    help="the launch choice before issue 11 instead of today's")
    ap.add_argument("--compare", action="store_true",
                    help="before (--baseline) -> after, side by side, in one table")
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--control", action="store_true",
                    help=f"also {CONTROL[0]} capped at {CONTROL[1]} registers, which must spill")
    ap.add_argument("--workers", type=int, default=None, help="compile processes (default: CPUs)")
    ap.add_argument("--search", action="store_true",
                    help="also every configuration the search keeps (bf16, d 64 and 128, causal)")
    args = ap.parse_args(argv)
    reason = unavailable_reason()
    if reason:
        print(json.dumps({"skip": reason}) if args.json else f"cannot compile: {reason}")
        return 3
    start = time.perf_counter()
    rows = compile_all(args.baseline and not args.compare, args.workers, args.search)
    if args.compare:
        print(render_compare(compile_all(True, args.workers), rows))
    elif args.json:
        for r in rows:
            print(json.dumps(asdict(r)))
        if args.control:
            print(json.dumps({**asdict(compile_case(CONTROL[0], maxnreg=CONTROL[1])),
                              "control": True}))
    else:
        print(render(rows))
    if not args.json:
        import triton

        print(f"\n{len(rows)} kernels, Triton {triton.__version__}, "
              f"{time.perf_counter() - start:.1f} s wall on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
