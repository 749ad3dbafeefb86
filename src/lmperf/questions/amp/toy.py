"""The course's ToyModel question, answered by running it under fp16 and bf16 autocast here:
(a) the dtypes inside it, (b) where LayerNorm is sensitive (method: docs/precision-lab.md#toy)."""

from __future__ import annotations

import argparse
import math
from typing import Sequence

import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F

from lmperf.questions.amp.base import ExperimentResult, dtype_name, dtype_names
from lmperf.questions.amp.policy import CUDA_DOCUMENTED_FP32, CUDA_DOCUMENTED_LOW, LOW_DTYPES
from lmperf.runtime import device as dev
from lmperf.validate import positive_int, subset

NAME = "toy"
SUMMARY = "the course's ToyModel under fp16/bf16 autocast: dtypes of params, outputs, loss, grads"

PARAMS_Q = "parameters inside autocast"
FC1_Q = "fc1 output"
RELU_Q = "ReLU output"
LN_Q = "LayerNorm output"
LOGITS_Q = "logits (fc2 output)"
LOSS_Q = "loss (cross_entropy)"
GRADS_Q = "gradients"
QUESTIONS: tuple[str, ...] = (PARAMS_Q, FC1_Q, RELU_Q, LN_Q, LOGITS_Q, LOSS_Q, GRADS_Q)

# The forward pass as a chain of ops, for reading CUDA's documented lists: each op's output
# dtype follows from its list and the dtype flowing into it.
_CHAIN: tuple[tuple[str, str], ...] = (
    (FC1_Q, "linear"), (RELU_Q, "relu"), (LN_Q, "layer_norm"), (LOGITS_Q, "linear"),
    (LOSS_Q, "cross_entropy"),
)


class ToyModel(nn.Module):
    """The course's toy network: fc1 (no bias) -> ReLU -> LayerNorm(10) -> fc2 (no bias).

    Shapes: (B, in_features) -> (B, 10) -> (B, out_features).
    """

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, 10, bias=False)
        self.ln = nn.LayerNorm(10)
        self.fc2 = nn.Linear(10, out_features, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.fc1(x))
        x = self.ln(x)
        return self.fc2(x)


def measure_answers(device: torch.device, low: torch.dtype, in_features: int = 16,
                    out_features: int = 4, batch: int = 8, seed: int = 0) -> dict[str, str]:
    """Run ToyModel forward+loss under torch.autocast(device.type, dtype=low), then backward.

    Returns question -> dtype name(s), for every question in QUESTIONS. The global RNG is
    forked, so building the model leaves the caller's random stream as it was.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = ToyModel(in_features, out_features).to(device)  # fp32 parameters
        x = torch.randn(batch, in_features).to(device)
        target = torch.randint(0, out_features, (batch,)).to(device)

    seen: dict[str, str] = {}
    hooks = [
        getattr(model, name).register_forward_hook(
            lambda _m, _args, out, q=q: seen.__setitem__(q, dtype_name(out.dtype)))
        for name, q in (("fc1", FC1_Q), ("relu", RELU_Q), ("ln", LN_Q), ("fc2", LOGITS_Q))
    ]
    try:
        with torch.autocast(device.type, dtype=low):
            seen[PARAMS_Q] = dtype_names(list(model.parameters()))
            logits = model(x)
            loss = F.cross_entropy(logits, target)
    finally:
        for h in hooks:
            h.remove()
    seen[LOSS_Q] = dtype_name(loss.dtype)
    # Backward outside autocast, as in training: autograd replays each op in the dtype its
    # forward ran in, and a leaf's .grad takes the leaf's (the parameter's) dtype.
    loss.backward()
    seen[GRADS_Q] = dtype_names([p.grad for p in model.parameters()])
    return {q: seen[q] for q in QUESTIONS}


def cuda_documented_answers(low: torch.dtype) -> dict[str, str]:
    """What CUDA autocast's documented op lists predict for ToyModel (not a measurement).

    Listed as lower-precision (linear): the low dtype; listed as fp32 (layer_norm,
    cross_entropy): float32; not listed (relu): the dtype flowing in. Parameters and gradients:
    float32, because autocast casts copies for each op and never the stored fp32 parameters.
    """
    answers = {PARAMS_Q: "float32", GRADS_Q: "float32"}
    flowing = "float32"  # the input batch
    for question, op in _CHAIN:
        if op in CUDA_DOCUMENTED_LOW:
            flowing = dtype_name(low)
        elif op in CUDA_DOCUMENTED_FP32:
            flowing = "float32"
        answers[question] = flowing
    return {q: answers[q] for q in QUESTIONS}


def _documented_list(op: str) -> str:
    """Which of CUDA autocast's documented lists `op` is on, in words."""
    if op in CUDA_DOCUMENTED_LOW:
        return "low dtype"
    if op in CUDA_DOCUMENTED_FP32:
        return "fp32"
    return "not listed (keeps its input dtype)"


def layer_norm_sensitivity(low: torch.dtype, features: int = 10, offset: float = 300.0,
                           seed: int = 0) -> list[dict[str, object]]:
    """Part (b) on one row of `features` values near `offset`, rounded to `low`.

    Returns rows {quantity, dtype, low_value, fp32_value}: the sum of squares, the one-pass
    variance E[x^2] - E[x]^2 (both computed in `low` and in fp32 from the same rounded values),
    and the largest error of this device's F.layer_norm given `low` inputs against fp32
    LayerNorm of the same values (fp32_value: the error of merely rounding that fp32 result).
    """
    gen = torch.Generator().manual_seed(seed)
    x = (offset + torch.randn(1, features, generator=gen)).to(low)  # (1, F)
    x32 = x.float()  # the same numbers, exactly, in fp32
    ref = F.layer_norm(x32, (features,))
    sumsq = (x * x).sum(-1)
    var1 = (x * x).mean(-1) - x.mean(-1) ** 2
    ln = F.layer_norm(x, (features,))
    name = dtype_name(low)
    return [
        {"quantity": f"sum of squares of {features} values near {offset:g}", "dtype": name,
         "low_value": sumsq.item(), "fp32_value": (x32 * x32).sum(-1).item()},
        {"quantity": "variance as E[x^2] - E[x]^2", "dtype": name,
         "low_value": var1.item(), "fp32_value": x32.var(-1, unbiased=False).item()},
        {"quantity": f"max |F.layer_norm error| ({name} in, this device)", "dtype": name,
         "low_value": (ln.float() - ref).abs().max().item(),
         "fp32_value": (ref.to(low).float() - ref).abs().max().item()},
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options: --dtypes, --in-features, --out-features, --batch, --seed."""
    parser.add_argument("--dtypes", nargs="+", default=list(LOW_DTYPES), metavar="DTYPE",
                        help=f"autocast dtypes: {', '.join(LOW_DTYPES)} (default: both)")
    parser.add_argument("--in-features", type=int, default=16,
                        help="ToyModel input width (default: 16)")
    parser.add_argument("--out-features", type=int, default=4,
                        help="ToyModel output width = number of classes (default: 4)")
    parser.add_argument("--batch", type=int, default=8, help="batch size (default: 8)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of weights and batch (default: 0)")


def _notes(df: pd.DataFrame, names: list[str], cuda_measured: bool,
           sens: pd.DataFrame) -> list[str]:
    notes = []
    cuda_kind = "" if cuda_measured else "_documented"
    for n in names:
        low = dtype_name(LOW_DTYPES[n])
        parts = "; ".join(f"{q}: {a}" for q, a in zip(df.question, df[f"cpu_{n}"]))
        notes.append(f"(a) On the CPU under autocast({low}): {parts}.")
        for q, mine, cuda in zip(df.question, df[f"cpu_{n}"], df[f"cuda_{n}{cuda_kind}"]):
            if mine != cuda:
                how = "measured" if cuda_measured else "documented policy, not measured here"
                notes.append(f"{q} under autocast({low}): {mine} on the CPU, {cuda} on CUDA "
                             f"({how}).")
    if not cuda_measured:
        listed = "; ".join(f"{op}: {_documented_list(op)}"
                           for op in dict.fromkeys(op for _, op in _CHAIN))
        notes.append("Columns cuda_*_documented are CUDA (documented policy, not measured here): "
                     "torch sees no GPU, so they are read off CUDA autocast's documented op "
                     f"lists ({listed}).")
    for n in names:
        low = LOW_DTYPES[n]
        rows = sens[sens.dtype == dtype_name(low)].set_index("quantity")
        fits = torch.finfo(low).max ** 0.5
        sumsq, var1, lnerr = (rows.iloc[i] for i in range(3))
        # Rounding the fp32 LayerNorm to the low dtype is the least error any kernel can have;
        # matching it means the kernel's statistics did not lose precision.
        as_good = lnerr.low_value <= 1.01 * lnerr.fp32_value + 1e-6
        verdict = (f"no worse than rounding, consistent with a kernel that takes its statistics "
                   f"in fp32 internally although it returns {dtype_name(low)}" if as_good else
                   "more than rounding alone: its statistics lose precision")
        notes.append(
            f"(b) {dtype_name(low)}: squares overflow above |x| ~ {fits:.3g}; the row's sum of "
            f"squares is {sumsq.low_value:.6g} in {dtype_name(low)} vs {sumsq.fp32_value:.6g} in "
            f"fp32, and the one-pass variance is {var1.low_value:.4g} vs {var1.fp32_value:.4g}. "
            f"This device's F.layer_norm on {dtype_name(low)} inputs is off by at most "
            f"{lnerr.low_value:.3g} (rounding the fp32 result alone: {lnerr.fp32_value:.3g}): "
            f"{verdict}.")
    notes.append(
        "(b) The sensitive parts of LayerNorm are its reductions, as the rows above show: the "
        "variance (a sum of squares that can overflow, then a subtraction that cancels when "
        "the mean is large) and the mean; the elementwise normalise-and-scale only rounds.")
    if "bf16" in names:
        bf = sens[sens.dtype == "bfloat16"]
        finite = math.isfinite(bf.iloc[0].low_value)
        rel = abs(bf.iloc[1].low_value - bf.iloc[1].fp32_value) / max(bf.iloc[1].fp32_value, 1e-30)
        significant = 1 - round(math.log2(torch.finfo(torch.bfloat16).eps))  # 2**-7 -> 8
        squares = ("stays finite (bf16 has fp32's exponent range)" if finite
                   else "still overflows")
        notes.append(
            f"(b) With bf16 the sum of squares {squares}, but the one-pass variance is "
            f"{bf.iloc[1].low_value:.4g} against "
            f"{bf.iloc[1].fp32_value:.4g} ({significant} significant bits): "
            + ("bf16 still needs LayerNorm's statistics accumulated in fp32, by autocast (CUDA's "
               "fp32 list) or inside the kernel." if rel > 0.1 else
               "on this row bf16 alone kept the statistics usable."))
    return notes


def check(device: torch.device, dtypes: Sequence[str] = tuple(LOW_DTYPES), in_features: int = 16,
          out_features: int = 4, batch: int = 8, seed: int = 0) -> list[str]:
    """Raise SpecError for a bad option (called before the experiment runs anywhere); return
    the dtype names, repeats dropped."""
    names = subset("dtype", dtypes, LOW_DTYPES)
    for label, value in (("in_features", in_features), ("out_features", out_features),
                         ("batch", batch)):
        positive_int(label, value)
    return names


def run(device: torch.device, dtypes: Sequence[str] = tuple(LOW_DTYPES), in_features: int = 16,
        out_features: int = 4, batch: int = 8, seed: int = 0) -> ExperimentResult:
    """Answer the ToyModel dtype questions on the CPU (and CUDA when torch sees a GPU).

    Returns an ExperimentResult with tables "ToyModel dtypes" (question, cpu_<dtype>...,
    cuda_<dtype> or cuda_<dtype>_documented..., differs_from_cuda) and "LayerNorm sensitivity"
    (quantity, dtype, low_value, fp32_value). Raises SpecError for a bad option.
    """
    names = check(device, dtypes, in_features, out_features, batch, seed)
    cuda_measured = dev.cuda_available()
    suffix = "" if cuda_measured else "_documented"
    table: dict[str, object] = {"question": list(QUESTIONS)}
    for n in names:
        ans = measure_answers(torch.device("cpu"), LOW_DTYPES[n], in_features, out_features,
                              batch, seed)
        table[f"cpu_{n}"] = [ans[q] for q in QUESTIONS]
    for n in names:
        ans = (measure_answers(torch.device("cuda"), LOW_DTYPES[n], in_features, out_features,
                               batch, seed) if cuda_measured
               else cuda_documented_answers(LOW_DTYPES[n]))
        table[f"cuda_{n}{suffix}"] = [ans[q] for q in QUESTIONS]
    df = pd.DataFrame(table)
    df["differs_from_cuda"] = [
        any(df.at[i, f"cpu_{n}"] != df.at[i, f"cuda_{n}{suffix}"] for n in names)
        for i in range(len(df))
    ]
    sens = pd.DataFrame([row for n in names
                         for row in layer_norm_sensitivity(LOW_DTYPES[n], seed=seed)])
    return ExperimentResult(
        experiment=NAME,
        params={"device": device.type, "dtypes": names, "in_features": in_features,
                "out_features": out_features, "batch": batch, "seed": seed,
                "cuda_measured": cuda_measured},
        tables=[("ToyModel dtypes", df), ("LayerNorm sensitivity", sens)],
        notes=_notes(df, names, cuda_measured, sens),
    )
