"""Attention numerics: flash-torch and flash-triton beside SDPA on small tensors.

Each implementation and `F.scaled_dot_product_attention` run on the same inputs, causal and not,
and their output and three input gradients are compared with the float64 reference the kernel
tests use (`kernels.reference`), within that dtype's tolerance there; SDPA's own error is
reported beside it, and so is the largest direct difference between the two. flash-triton runs
in a child process: Triton picks its interpreter (TRITON_INTERPRET=1, the CPU's only way to run
it) when it is first imported, so the child gets the setting its device needs whatever this
process has imported already.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
from typing import Callable

import torch

from lmperf.questions.doctor.checks import Context, Outcome, passed, skip

SHAPE = (1, 2, 40, 16)
"""(batch, heads, seq, head dim): 40 is not a multiple of the tiles, so ragged edges are used."""
CHILD_TIMEOUT_S = 240
SHAPES: tuple[tuple[int, int, int, int], ...] = ((2, 3, 257, 64), (1, 2, 300, 128))
"""The shape sweep (CUDA): ragged lengths one past and well past the tiles, d = 64 and 128 (the
launch table's largest), several batches and heads (the grid's second axis)."""
LONG_BF16 = (1, 2, 1030, 64)
"""bf16, causal: many query tiles, so every program walks several key tiles before the diagonal
tile (the multi-tile causal path), and a ragged last tile; with the configurations searched."""
SHAPES_CPU_SKIP = ("Triton's interpreter needs ~90 s for this sweep on a 2-core CPU (measured "
                   "2026-11-25); the small-shape row above checks the interpreter path")


def _forward_backward(fn: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      do: torch.Tensor, causal: bool) -> list[torch.Tensor]:
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    o = fn(*leaves, causal)
    o.backward(do)
    return [o.detach(), *(t.grad for t in leaves)]


def compare_with_sdpa(fn: Callable, device: torch.device, dtype: torch.dtype,
                      seed: int = 0, shape: tuple[int, int, int, int] = SHAPE,
                      causal_only: bool = False) -> dict[str, float]:
    """fn and SDPA against the float64 reference, over o, dq, dk, dv, causal and not.

    Returns {'max_abs_err': fn's worst |error|, 'sdpa_abs_err': SDPA's, 'vs_sdpa': the worst
    |fn - SDPA|, 'worst_excess': max(|error| - (atol + rtol |ref|)) over fn's values (<= 0:
    within tolerance), 'atol', 'rtol'}.
    """
    from lmperf.kernels import sdpa_attention
    from lmperf.kernels.reference import reference_forward_backward, tolerance

    atol, rtol = tolerance(dtype)
    gen = torch.Generator().manual_seed(seed)
    # (B, H, T, d) each: q, k, v and the upstream gradient dO
    q, k, v, do = (torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
                   for _ in range(4))
    out = {"max_abs_err": 0.0, "sdpa_abs_err": 0.0, "vs_sdpa": 0.0, "worst_excess": -float("inf"),
           "atol": atol, "rtol": rtol}
    for causal in (True,) if causal_only else (False, True):
        ref = reference_forward_backward(q, k, v, do, causal)
        mine = _forward_backward(fn, q, k, v, do, causal)
        sdpa = _forward_backward(sdpa_attention, q, k, v, do, causal)
        for a, s, r in zip(mine, sdpa, ref):
            err = (a.double() - r).abs()
            out["max_abs_err"] = max(out["max_abs_err"], float(err.max()))
            out["sdpa_abs_err"] = max(out["sdpa_abs_err"], float((s.double() - r).abs().max()))
            out["vs_sdpa"] = max(out["vs_sdpa"], float((a.double() - s.double()).abs().max()))
            out["worst_excess"] = max(out["worst_excess"],
                                      float((err - (atol + rtol * r.abs())).max()))
    return out


def judged(name: str, dtypes: dict[str, dict[str, float]]) -> Outcome:
    """ok when every dtype's errors stayed within its tolerance of the float64 reference."""
    parts = [f"{d} {r['max_abs_err']:.1e} (SDPA {r['sdpa_abs_err']:.1e})"
             for d, r in dtypes.items()]
    bounds = ", ".join(f"{d} {r['atol']:g} + {r['rtol']:g}|ref|" for d, r in dtypes.items())
    return passed(all(r["worst_excess"] <= 0 for r in dtypes.values()),
                  f"{name}, max |err| of o, dq, dk, dv vs fp64: " + ", ".join(parts),
                  f"within {bounds} (the kernel tests' bound), causal and not",
                  **dtypes)


def dtypes_for(device: torch.device) -> dict[str, torch.dtype]:
    """fp32 everywhere; bf16 too on a GPU with native bf16 (small and fast there)."""
    from lmperf.runtime import device as dev

    out = {"fp32": torch.float32}
    if device.type == "cuda" and dev.bf16_supported(device):
        out["bf16"] = torch.bfloat16
    return out


def check_flash_torch(ctx: Context) -> Outcome:
    """flash-torch (FlashAttention-2 in PyTorch) against SDPA on ctx's device."""
    from lmperf.kernels.flash_torch import flash_attention_torch

    return judged("flash-torch", {name: compare_with_sdpa(flash_attention_torch, ctx.device, dt)
                                  for name, dt in dtypes_for(ctx.device).items()})


# --- flash-triton, in a child process ---------------------------------------------------------

def start_flash_triton(ctx: Context, mode: str = "small") -> Callable[[], dict]:
    """The launch: `python -m lmperf.questions.doctor.numerics DEVICE MODE` with
    TRITON_INTERPRET set for the CPU and cleared for CUDA; returns its JSON answer (or
    {'error': ...}). mode: 'small' (SHAPE) or 'shapes' (the CUDA sweep)."""
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    if ctx.device.type == "cpu":
        env["TRITON_INTERPRET"] = "1"
    cmd = [sys.executable, "-m", "lmperf.questions.doctor.numerics", ctx.device.type, mode]

    def run() -> dict:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                                  timeout=CHILD_TIMEOUT_S, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return {"error": f"the flash-triton child ran past {CHILD_TIMEOUT_S} s"}
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            return {"error": f"the flash-triton child exited with {proc.returncode}: {tail}"}
        return json.loads(lines[-1])

    return run


def _triton_answer(ctx: Context, launch: Callable) -> dict | Outcome:
    """The child's answer, or the Outcome that ends the check: a skip without Triton (or, on
    the CPU, with an interpreter that cannot run the kernels), a fail when the child failed."""
    from lmperf.kernels.flash_triton import triton_available

    if not triton_available():
        return skip("Triton is not installed (pip install triton): --attention flash-triton is "
                    "unavailable")
    if ctx.device.type == "cpu":
        from lmperf.kernels import interpreter_gap

        if (gap := interpreter_gap()):
            return skip(gap)
    answer = ctx.result_of(launch)
    if "error" in answer:
        return passed(False, answer["error"][:160], "the child must run the kernels")
    return answer


def check_flash_triton(ctx: Context) -> Outcome:
    """flash-triton against SDPA: compiled on CUDA, through Triton's interpreter on the CPU."""
    answer = _triton_answer(ctx, start_flash_triton)
    if isinstance(answer, Outcome):
        return answer
    how = "interpreter" if ctx.device.type == "cpu" else "compiled"
    return judged(f"flash-triton ({how})", answer["dtypes"])


start_flash_triton_shapes = functools.partial(start_flash_triton, mode="shapes")
"""The launch of the shape sweep: the same child, in its 'shapes' mode."""


def check_flash_triton_shapes(ctx: Context) -> Outcome:
    """flash-triton against the float64 reference on SHAPES in fp32, fp16 and bf16, causal and
    not, and on LONG_BF16 causal (compiled; the interpreter is too slow for these sizes)."""
    if ctx.device.type != "cuda":
        return skip(SHAPES_CPU_SKIP)
    answer = _triton_answer(ctx, start_flash_triton_shapes)
    if isinstance(answer, Outcome):
        return answer
    cases = answer["dtypes"]
    # the worst case relative to its own bound: excess over atol + rtol |ref| (<= 0: within)
    worst = max(cases, key=lambda c: cases[c]["worst_excess"])
    bad = [c for c, r in cases.items() if r["worst_excess"] > 0]
    result = (f"{len(cases)} cases (o, dq, dk, dv vs fp64): "
              + (f"beyond the bound: {', '.join(bad)}" if bad else "all within their bound")
              + f"; closest {worst}: max |err| {cases[worst]['max_abs_err']:.1e} "
              f"(SDPA {cases[worst]['sdpa_abs_err']:.1e})")
    return passed(not bad, result, "each dtype's kernel-test bound (kernels.reference), causal "
                  "and not; bf16 multi-tile causal, searched configurations", **cases)


def sweep_cases(device: torch.device) -> list[tuple[str, tuple[int, int, int, int], torch.dtype, bool]]:
    """(label, shape, dtype, causal only) of the shape sweep on `device`."""
    from lmperf.runtime import device as dev

    dtypes = {"fp32": torch.float32, "fp16": torch.float16}
    if dev.bf16_supported(device):
        dtypes["bf16"] = torch.bfloat16
    cases = [(f"{name} {'x'.join(map(str, shape))}", shape, dt, False)
             for shape in SHAPES for name, dt in dtypes.items()]
    if "bf16" in dtypes:
        cases.append((f"bf16 {'x'.join(map(str, LONG_BF16))} causal", LONG_BF16, torch.bfloat16,
                      True))
    return cases


def _child(device_type: str, mode: str = "small") -> dict:
    from lmperf.kernels import flash_configs as fc
    from lmperf.kernels.flash_triton import flash_attention_triton

    device, out = torch.device(device_type), {}
    if mode != "shapes":
        return {"dtypes": {name: compare_with_sdpa(flash_attention_triton, device, dt)
                           for name, dt in dtypes_for(device).items()}}
    # shapes: LONG_BF16 inside a launch search (the jobs' warm-up's; one key per kernel, ~15
    # compiles more on sm_90, est.), so what it chose is compared with fp64; `configs`: the
    # launch each kernel ran causal (not causal: the defaults, never searched here)
    for label, (b, h, n, d), dt, causal_only in sweep_cases(device):
        search = (b, h, n, d) == LONG_BF16
        with fc.searching() if search else contextlib.nullcontext([]) as searches:
            out[label] = compare_with_sdpa(flash_attention_triton, device, dt, shape=(b, h, n, d),
                                           causal_only=causal_only)
        out[label]["configs"] = {k: fc.CHOSEN.get(fc.search_key(k, b * h, n, n, d, dt, True),
                                                  fc.default_config(k, dt, d)).label()
                                 for k in fc.KERNELS}
        out[label].update({"autotune": searches} if search else {})
    return {"dtypes": out}


if __name__ == "__main__":  # the child: one JSON line on stdout
    print(json.dumps(_child(sys.argv[1], *sys.argv[2:3])))
