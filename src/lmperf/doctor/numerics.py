"""Attention numerics: flash-torch and flash-triton against SDPA on small tensors.

Forward output and the three input gradients of each implementation are compared with
`F.scaled_dot_product_attention` on the same inputs, causal and not, within the tolerance of
the dtype the project's kernel tests use (`kernels.reference.tolerance`). flash-triton runs in
a child process: Triton picks its interpreter (TRITON_INTERPRET=1, the CPU's only way to run
it) when it is first imported, so the child gets the setting its device needs whatever this
process has imported already.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Callable

import torch
import torch.nn.functional as F

from lmperf.doctor.checks import Context, Outcome, passed, skip

SHAPE = (1, 2, 40, 16)
"""(batch, heads, seq, head dim): 40 is not a multiple of the tiles, so ragged edges are used."""
CHILD_TIMEOUT_S = 300


def compare_with_sdpa(fn: Callable, device: torch.device, dtype: torch.dtype,
                      seed: int = 0) -> dict[str, float]:
    """Worst |fn - sdpa| over the output and dq, dk, dv, causal and not, and its bound.

    Returns {'max_abs_err': e, 'worst_excess': max(|a - b| - (atol + rtol |b|)) (<= 0 within
    tolerance), 'atol': ..., 'rtol': ...}.
    """
    from lmperf.kernels.reference import tolerance

    atol, rtol = tolerance(dtype)
    gen = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(SHAPE, generator=gen).to(device=device, dtype=dtype)
                   for _ in range(4))
    worst, excess = 0.0, -float("inf")
    for causal in (False, True):
        outs = []
        for impl in (fn, lambda a, b, c, d: F.scaled_dot_product_attention(a, b, c, is_causal=d)):
            leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
            o = impl(*leaves, causal)
            o.backward(do)
            outs.append([o.detach(), *(t.grad for t in leaves)])
        for a, b in zip(*outs):
            diff = (a.float() - b.float()).abs()
            worst = max(worst, float(diff.max()))
            excess = max(excess, float((diff - (atol + rtol * b.float().abs())).max()))
    return {"max_abs_err": worst, "worst_excess": excess, "atol": atol, "rtol": rtol}


def judged(name: str, dtypes: dict[str, dict[str, float]]) -> Outcome:
    """ok when every dtype's comparison stayed within its tolerance."""
    parts = [f"{d} {r['max_abs_err']:.1e}" for d, r in dtypes.items()]
    bounds = ", ".join(f"{d} {r['atol']:g} + {r['rtol']:g}|x|" for d, r in dtypes.items())
    return passed(all(r["worst_excess"] <= 0 for r in dtypes.values()),
                  f"{name} vs SDPA, max |diff| of o, dq, dk, dv: " + ", ".join(parts),
                  f"within {bounds} (the kernel tests' bound), causal and not",
                  **{d: r for d, r in dtypes.items()})


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

def start_flash_triton(ctx: Context) -> Callable[[], dict]:
    """The background part: `python -m lmperf.doctor.numerics DEVICE` with TRITON_INTERPRET set
    for the CPU and cleared for CUDA; returns its JSON answer (or {'error': ...})."""
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    if ctx.device.type == "cpu":
        env["TRITON_INTERPRET"] = "1"
    cmd = [sys.executable, "-m", "lmperf.doctor.numerics", ctx.device.type]

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


def check_flash_triton(ctx: Context, name: str) -> Outcome:
    """flash-triton against SDPA: compiled on CUDA, through Triton's interpreter on the CPU."""
    from lmperf.kernels.flash_triton import triton_available

    if not triton_available():
        return skip("Triton is not installed (pip install triton): --attention flash-triton is "
                    "unavailable")
    answer = ctx.background[name].result()
    if "error" in answer:
        return passed(False, answer["error"][:160], "the child must run the kernels")
    how = "interpreter" if ctx.device.type == "cpu" else "compiled"
    return judged(f"flash-triton ({how})", answer["dtypes"])


def _child(device_type: str) -> dict:
    from lmperf.kernels.flash_triton import flash_attention_triton

    device = torch.device(device_type)
    return {"dtypes": {name: compare_with_sdpa(flash_attention_triton, device, dt)
                       for name, dt in dtypes_for(device).items()}}


if __name__ == "__main__":  # the child: one JSON line on stdout
    print(json.dumps(_child(sys.argv[1])))
