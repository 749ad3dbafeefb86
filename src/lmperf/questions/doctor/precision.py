"""Mixed precision: autocast's dtypes against the documented policy, and the GradScaler paths.

The op probes are the `lmperf amp policy` experiment's own (`amp.policy.probe_op`): each op is
run under `torch.autocast(device, low)` with fp32 inputs (eligible ops come out low) and with low
inputs (ops on the fp32 list come out fp32). What is expected is torch's documentation
("Autocast Op Reference"): on CUDA the lists `amp.policy` records; on the CPU, matmuls go to
bf16, losses such as cross_entropy and mse_loss to fp32, and softmax is on neither CPU list, so
it keeps its input dtype (the difference from CUDA the amp experiment points out).
"""

from __future__ import annotations

import torch

from lmperf.questions.doctor.checks import Context, Outcome, passed, skip
from lmperf.runtime import device as dev

# (op, input dtype "fp32" or "low") -> the behaviour torch documents, per device type.
CPU_EXPECTED: dict[tuple[str, str], str] = {
    ("matmul", "fp32"): "casts to low", ("linear", "fp32"): "casts to low",
    ("bmm", "fp32"): "casts to low",
    ("cross_entropy", "low"): "runs in fp32 (upcast)", ("mse_loss", "low"): "runs in fp32 (upcast)",
    ("softmax", "low"): "keeps input dtype",
}
MAX_STEPS = 8
CUDA_OPS = ("matmul", "linear", "bmm", "softmax", "log_softmax", "layer_norm", "cross_entropy")


def cuda_expected() -> dict[tuple[str, str], str]:
    """The documented CUDA policy for CUDA_OPS (the lists `amp.policy` keeps)."""
    from lmperf.questions.amp.policy import CASTS_TO_LOW, CUDA_DOCUMENTED_FP32, CUDA_DOCUMENTED_LOW, UPCAST

    out = {}
    for op in CUDA_OPS:
        if op in CUDA_DOCUMENTED_LOW:
            out[(op, "fp32")] = CASTS_TO_LOW
        elif op in CUDA_DOCUMENTED_FP32:
            out[(op, "low")] = UPCAST
    return out


def check_autocast(ctx: Context) -> Outcome:
    """Every probed op behaves under autocast as documented, for each low dtype this device runs
    natively (CPU: bf16; CUDA: fp16, and bf16 from compute capability 8.0)."""
    from lmperf.questions.amp.policy import probe_op

    device = ctx.device
    cuda = device.type == "cuda"
    expected = cuda_expected() if cuda else CPU_EXPECTED
    lows = {"fp16": torch.float16} if cuda else {}
    if dev.bf16_supported(device):
        lows["bf16"] = torch.bfloat16
    wrong, seen = [], 0
    for low_name, low in lows.items():
        for (op, given), behaviour in expected.items():
            input_dtype = torch.float32 if given == "fp32" else low
            out, got = probe_op(op, low, input_dtype, device)
            seen += 1
            if got != behaviour:
                wrong.append(f"{op}({given}) under {low_name}: {got}")
    result = (f"{seen - len(wrong)}/{seen} as documented ({', '.join(lows)}): matmul, linear, "
              f"bmm -> low; " + ("softmax, log_softmax, layer_norm, cross_entropy -> fp32"
                                 if cuda else "cross_entropy, mse_loss -> fp32; softmax keeps"))
    if wrong:
        result = f"{len(wrong)}/{seen} differ: " + "; ".join(wrong)[:140]
    return passed(not wrong, result, "torch's Autocast Op Reference ("
                  + ("CUDA)" if cuda else "CPU)"), probed=seen, differing=wrong)


def check_scaler_disabled(ctx: Context) -> Outcome:
    """The CPU regimes' GradScaler is disabled: scale() is the identity, the scale is 1, and
    scaler.step(opt) updates the parameters exactly as opt.step() does."""
    from lmperf.runtime.precision import get_regime, grad_scaler

    device = ctx.device
    scaler = grad_scaler(get_regime("bf16-mixed"), device)
    gen = torch.Generator().manual_seed(0)
    weights = torch.randn(8, 8, generator=gen).to(device)
    pair = [torch.nn.Parameter(weights.clone()), torch.nn.Parameter(weights.clone())]
    opts = [torch.optim.AdamW([p], lr=1e-2) for p in pair]
    x = torch.randn(4, 8, generator=gen).to(device)
    loss = (x @ pair[0]).square().mean()
    scaled = scaler.scale(loss)
    scaled.backward()
    (x @ pair[1]).square().mean().backward()
    scaler.unscale_(opts[0])
    scaler.step(opts[0])
    scaler.update()
    opts[1].step()
    same = torch.equal(pair[0], pair[1]) and not torch.equal(pair[0], weights)
    result = (f"enabled={scaler.is_enabled()}, scale() "
              f"{'is the identity' if scaled is loss else 'copies'}, get_scale()="
              f"{scaler.get_scale():g}, step == plain AdamW step: {same}")
    return passed(not scaler.is_enabled() and scaled is loss and scaler.get_scale() == 1.0 and same,
                  result, "a disabled scaler passes everything through")


def check_scaler_fused(ctx: Context) -> Outcome:
    """fp16-mixed on CUDA: the GradScaler with fused AdamW steps (parameters move, the scale stays
    finite), and an inf gradient makes it skip the step and halve the scale."""
    from lmperf.questions.doctor.timing import tiny_step
    from lmperf.workload.steps import NO_OBSERVER

    device = ctx.device
    if not dev.fused_adamw_supported(device):
        return skip("AdamW(fused=True) does not run here")
    prepared = tiny_step(device, precision="fp16-mixed", warmup=0)
    state = prepared.state
    optimizer_kind = type(state.optimizer).__name__ + (
        " (fused)" if state.optimizer.defaults.get("fused") else "")
    first = next(state.model.parameters())
    scale0 = state.scaler.get_scale()
    before = first.detach().clone()
    steps = 0
    # The first steps at the initial scale (2**16) may overflow and be skipped, as they may in
    # any fp16 run: step until one is taken (the scale halves at each skip).
    while steps < MAX_STEPS and torch.equal(before, first.detach()):
        out = prepared.step(state, NO_OBSERVER)
        steps += 1
    moved = not torch.equal(before, first.detach())
    scale1 = state.scaler.get_scale()
    kept = first.detach().clone()
    state.fault = lambda step, loss: loss * float("inf")  # every gradient inf / NaN
    prepared.step(state, NO_OBSERVER)
    state.fault = lambda step, loss: loss
    skipped = torch.equal(kept, first.detach())
    scale2 = state.scaler.get_scale()
    finite = bool(torch.isfinite(out.loss))
    result = (f"{optimizer_kind}: scale {scale0:g} -> {scale1:g} in {steps} step(s), params "
              f"moved: {moved}; an inf gradient: step skipped {skipped}, scale -> {scale2:g}")
    return passed(state.scaler.is_enabled() and moved and finite and skipped
                  and scale2 == scale1 / 2 and "fused" in optimizer_kind, result,
                  "fused AdamW must step under the scaler and skip an overflowed step",
                  scale=[scale0, scale1, scale2])
