"""Autocast's operator policy on this torch and device, found by running each op under autocast
with fp32 and with low-precision inputs (method: docs/precision-lab.md#policy). The CUDA lists
here are the *documented* policy, never a measurement."""

from __future__ import annotations

import argparse
import math
from typing import Callable, Sequence

import pandas as pd
import torch
import torch.nn.functional as F

from lmperf.core.outcome import first_line
from lmperf.questions.amp.base import ExperimentResult, dtype_name
from lmperf.runtime import device as dev
from lmperf.validate import subset

NAME = "policy"
SUMMARY = "which ops autocast casts to fp16/bf16, upcasts to fp32 or leaves alone, on this device"

LOW_DTYPES: dict[str, torch.dtype] = {"fp16": torch.float16, "bf16": torch.bfloat16}

# The torch.amp documentation ("Autocast Op Reference", CUDA section), for the ops probed here.
# Documentation, not measurement: used only to name what students expect and, without a GPU,
# to fill a column that says "documented, not measured".
CUDA_DOCUMENTED_LOW: frozenset[str] = frozenset({
    "matmul", "mm", "bmm", "linear", "baddbmm", "addmm", "conv1d",
})
CUDA_DOCUMENTED_FP32: frozenset[str] = frozenset({
    "softmax", "log_softmax", "layer_norm", "group_norm", "exp", "log", "pow", "rsqrt", "sum",
    "cumsum", "prod", "norm", "cross_entropy", "nll_loss", "mse_loss",
    "binary_cross_entropy_with_logits",
})

CASTS_TO_LOW = "casts to low"
UPCAST = "runs in fp32 (upcast)"
KEEPS = "keeps input dtype"

Maker = Callable[..., torch.Tensor]
OpFn = Callable[[Maker, torch.device], torch.Tensor]


def _ids(device: torch.device, high: int, *shape: int) -> torch.Tensor:
    """Integer ids / class targets in [0, high): the non-float inputs some ops need."""
    return (torch.arange(math.prod(shape)) % high).reshape(shape).to(device)


# Each op receives `make(*shape, kind=...)`, which returns a float tensor in the probe's input
# dtype on the probe's device. Shapes are tiny (4x8 and the like) because fp16 on a CPU is slow.
OPS: dict[str, OpFn] = {
    "matmul": lambda m, d: torch.matmul(m(4, 8), m(8, 4)),
    "mm": lambda m, d: torch.mm(m(4, 8), m(8, 4)),
    "bmm": lambda m, d: torch.bmm(m(2, 4, 8), m(2, 8, 4)),
    "einsum": lambda m, d: torch.einsum("bij,bjk->bik", m(2, 4, 8), m(2, 8, 4)),
    "linear": lambda m, d: F.linear(m(4, 8), m(6, 8), m(6)),
    "baddbmm": lambda m, d: torch.baddbmm(m(2, 4, 4), m(2, 4, 8), m(2, 8, 4)),
    "addmm": lambda m, d: torch.addmm(m(4, 4), m(4, 8), m(8, 4)),
    "conv1d": lambda m, d: F.conv1d(m(1, 4, 8), m(6, 4, 3)),
    "scaled_dot_product_attention":
        lambda m, d: F.scaled_dot_product_attention(m(1, 2, 4, 8), m(1, 2, 4, 8), m(1, 2, 4, 8),
                                                    is_causal=True),
    "softmax": lambda m, d: F.softmax(m(4, 8), dim=-1),
    "log_softmax": lambda m, d: F.log_softmax(m(4, 8), dim=-1),
    "layer_norm": lambda m, d: F.layer_norm(m(4, 8), (8,), m(8), m(8)),
    "group_norm": lambda m, d: F.group_norm(m(2, 4, 8), 2, m(4), m(4)),
    "exp": lambda m, d: torch.exp(m(4, 8)),
    "log": lambda m, d: torch.log(m(4, 8, kind="positive")),
    "pow": lambda m, d: torch.pow(m(4, 8), 2),
    "rsqrt": lambda m, d: torch.rsqrt(m(4, 8, kind="positive")),
    "sqrt": lambda m, d: torch.sqrt(m(4, 8, kind="positive")),
    "sum": lambda m, d: torch.sum(m(4, 8)),
    "mean": lambda m, d: torch.mean(m(4, 8)),
    "cumsum": lambda m, d: torch.cumsum(m(4, 8), dim=-1),
    "prod": lambda m, d: torch.prod(m(4, 8), dim=-1),
    "vector_norm": lambda m, d: torch.linalg.vector_norm(m(4, 8), dim=-1),
    "norm": lambda m, d: torch.norm(m(4, 8)),
    "cross_entropy": lambda m, d: F.cross_entropy(m(4, 8), _ids(d, 8, 4)),
    "nll_loss": lambda m, d: F.nll_loss(m(4, 8), _ids(d, 8, 4)),
    "mse_loss": lambda m, d: F.mse_loss(m(4, 8), m(4, 8)),
    "binary_cross_entropy_with_logits":
        lambda m, d: F.binary_cross_entropy_with_logits(m(4, 8), m(4, 8, kind="unit")),
    "gelu": lambda m, d: F.gelu(m(4, 8)),
    "silu": lambda m, d: F.silu(m(4, 8)),
    "relu": lambda m, d: F.relu(m(4, 8)),
    "sigmoid": lambda m, d: torch.sigmoid(m(4, 8)),
    "tanh": lambda m, d: torch.tanh(m(4, 8)),
    "add": lambda m, d: torch.add(m(4, 8), m(4, 8)),
    "mul": lambda m, d: torch.mul(m(4, 8), m(4, 8)),
    "div": lambda m, d: torch.div(m(4, 8), m(4, 8, kind="positive")),
    "cat": lambda m, d: torch.cat([m(4, 8), m(4, 8)]),
    "stack": lambda m, d: torch.stack([m(4, 8), m(4, 8)]),
    "where": lambda m, d: torch.where(_ids(d, 2, 4, 8).bool(), m(4, 8), m(4, 8)),
    "embedding": lambda m, d: F.embedding(_ids(d, 10, 2, 4), m(10, 8)),
    # training=True so the dropout kernel really runs: with training=False (or p=0) F.dropout
    # hands back its input, which would say nothing about autocast.
    "dropout": lambda m, d: F.dropout(m(4, 8), p=0.5, training=True),
    "max": lambda m, d: torch.max(m(4, 8), dim=-1).values,
    "topk": lambda m, d: torch.topk(m(4, 8), k=2, dim=-1).values,
}
if hasattr(F, "rms_norm"):  # F.rms_norm appeared in torch 2.4
    OPS["rms_norm"] = lambda m, d: F.rms_norm(m(4, 8), (8,), m(8))


def _maker(dtype: torch.dtype, device: torch.device, seed: int) -> Maker:
    """A tensor factory for one op call: fp32 values from a private generator, then cast.

    The values are drawn in fp32 on the CPU and cast outside autocast, so fp32 and low inputs
    hold the same numbers and the global RNG is never touched.
    """
    gen = torch.Generator().manual_seed(seed)

    def make(*shape: int, kind: str = "normal") -> torch.Tensor:
        if kind == "unit":  # probabilities / BCE targets in [0, 1)
            x = torch.rand(shape, generator=gen)
        else:
            x = torch.randn(shape, generator=gen)
            if kind == "positive":  # log, sqrt, rsqrt, divisor: keep away from 0
                x = x.abs() + 0.5
        return x.to(device=device, dtype=dtype)

    return make


def classify(input_dtype: torch.dtype, output_dtype: torch.dtype, low: torch.dtype) -> str:
    """The behaviour an (input dtype, output dtype) pair shows under autocast(low): CASTS_TO_LOW
    (fp32 in, low out), UPCAST (low in, fp32 out), KEEPS (out == in) or "other: <dtype>"."""
    if output_dtype == input_dtype:
        return KEEPS
    if input_dtype == torch.float32 and output_dtype == low:
        return CASTS_TO_LOW
    if input_dtype == low and output_dtype == torch.float32:
        return UPCAST
    return f"other: {dtype_name(output_dtype)}"


def probe_op(op: str, low: torch.dtype, input_dtype: torch.dtype,
             device: torch.device) -> tuple[str | None, str]:
    """Run `op` once under torch.autocast(device.type, dtype=low) with inputs in `input_dtype`:
    (output dtype name, behaviour), or (None, "error: ...") when it raised; KeyError: unknown op."""
    fn = OPS[op]
    make = _maker(input_dtype, device, seed=0)
    # dropout draws from the device's global generator: fork it so the caller's RNG stream is
    # unchanged. CUDA's generator is forked only on the current device (index from the device).
    # fork_rng always saves and restores the CPU generator; `devices` adds accelerator ones.
    fork_devices = [] if device.type == "cpu" else [device.index or 0]
    fork_type = "cuda" if device.type == "cpu" else device.type
    try:
        with torch.random.fork_rng(devices=fork_devices, device_type=fork_type), \
                torch.no_grad(), torch.autocast(device.type, dtype=low):
            out = fn(make, device)
    except (RuntimeError, NotImplementedError, TypeError, ValueError) as exc:
        return None, f"error: {first_line(exc)[:70]}"  # cut to a table-friendly length
    return dtype_name(out.dtype), classify(input_dtype, out.dtype, low)


def probe_policy(devices: Sequence[torch.device], dtypes: Sequence[str],
                 ops: Sequence[str]) -> pd.DataFrame:
    """The policy table: one row per (op, autocast dtype, input dtype), with
    `<device>_output_dtype` and `<device>_behaviour` per device and, for several devices,
    `differs` (True where they disagree)."""
    rows = []
    for op in ops:
        for name in dtypes:
            low = LOW_DTYPES[name]
            for input_dtype in (torch.float32, low):
                row: dict[str, object] = {"op": op, "autocast_dtype": dtype_name(low),
                                          "input_dtype": dtype_name(input_dtype)}
                for d in devices:
                    out, behaviour = probe_op(op, low, input_dtype, d)
                    row[f"{d.type}_output_dtype"] = out
                    row[f"{d.type}_behaviour"] = behaviour
                if len(devices) > 1:
                    row["differs"] = len({row[f"{d.type}_behaviour"] for d in devices}) > 1
                rows.append(row)
    return pd.DataFrame(rows)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options: --dtypes (autocast dtypes to probe) and --ops (a subset of the probed ops)."""
    parser.add_argument("--dtypes", nargs="+", default=list(LOW_DTYPES), metavar="DTYPE",
                        help=f"autocast dtypes to probe: {', '.join(LOW_DTYPES)} "
                             "(default: both)")
    parser.add_argument("--ops", nargs="+", default=None, metavar="OP",
                        help=f"ops to probe (default: all): {', '.join(OPS)}")


def _ops_with(df: pd.DataFrame, device: str, low: str, input_dtype: str,
              behaviour: str) -> list[str]:
    sel = df[(df.autocast_dtype == low) & (df.input_dtype == input_dtype)
             & (df[f"{device}_behaviour"] == behaviour)]
    return list(sel.op)


def _notes(df: pd.DataFrame, devices: Sequence[torch.device], dtypes: Sequence[str]) -> list[str]:
    # The answer first (the report's headline): the first dtype on the first device, counted.
    d, low = devices[0].type, dtype_name(LOW_DTYPES[dtypes[0]])
    cast, up = _ops_with(df, d, low, "float32", CASTS_TO_LOW), _ops_with(df, d, low, low, UPCAST)
    rest = df[df.autocast_dtype == low].op.nunique() - len(cast) - len(up)
    notes = [f"autocast({low}) on the {d.upper()}: {len(cast)} ops cast fp32 inputs to {low} "
             f"({', '.join(cast[:4])}, ...), {len(up)} run {low} inputs in fp32 "
             f"({', '.join(up[:3])}, ...), {rest} keep their input dtype."]
    for d in devices:
        where = d.type.upper() if d.type == "cuda" else "the CPU"
        for name in dtypes:
            low = dtype_name(LOW_DTYPES[name])
            cast = _ops_with(df, d.type, low, "float32", CASTS_TO_LOW)
            up = _ops_with(df, d.type, low, low, UPCAST)
            kept = _ops_with(df, d.type, low, low, KEEPS)
            errors = sorted(set(df[(df.autocast_dtype == low)
                                   & df[f"{d.type}_behaviour"].str.startswith("error")].op))
            notes.append(f"On {where} under autocast({low}), fp32 inputs are cast to {low} by: "
                         f"{', '.join(cast) or 'no probed op'}.")
            notes.append(f"On {where} under autocast({low}), {low} inputs are upcast to float32 "
                         f"by: {', '.join(up) or 'no probed op'}.")
            believed = [op for op in kept if op in CUDA_DOCUMENTED_FP32]
            if believed:
                notes.append(
                    f"On {where} under autocast({low}), these ops are on CUDA's documented fp32 "
                    f"list (what students usually expect) but here return {low} when given "
                    f"{low} inputs: {', '.join(believed)}. With fp32 inputs they return fp32 "
                    "only because autocast leaves them alone, not because it upcasts them.")
            if errors:
                notes.append(f"On {where} under autocast({low}), these ops raised an error: "
                             f"{', '.join(errors)}.")
    if "differs" in df.columns:
        diff = sorted(set(df[df.differs].op))
        notes.append(f"CPU and CUDA disagree on: {', '.join(diff) or 'no probed op'}.")
    else:
        notes.append("torch sees no CUDA device here, so only the CPU columns appear; CUDA's "
                     "autocast policy (its own op lists) was not measured in this run.")
    return notes


def check(device: torch.device, dtypes: Sequence[str] = tuple(LOW_DTYPES),
          ops: Sequence[str] | None = None) -> tuple[list[str], list[str]]:
    """Raise SpecError for a bad option (called before the experiment runs anywhere); return
    the dtype names and op names (None: all), repeats dropped."""
    return subset("dtype", dtypes, LOW_DTYPES), subset("op", OPS if ops is None else ops, OPS)


def run(device: torch.device, dtypes: Sequence[str] = tuple(LOW_DTYPES),
        ops: Sequence[str] | None = None) -> ExperimentResult:
    """Probe the autocast policy for `dtypes` ("fp16", "bf16") and `ops` (names from OPS; None:
    all) on the CPU, and on CUDA too when torch sees a GPU, whatever `device` is. Returns an
    ExperimentResult with one table, "autocast policy"; SpecError for an unknown name."""
    dtype_names, op_names = check(device, dtypes, ops)
    devices = [torch.device("cpu")]
    if dev.cuda_available():
        devices.append(torch.device("cuda"))
    df = probe_policy(devices, dtype_names, op_names)
    return ExperimentResult(
        experiment=NAME,
        params={"device": device.type, "probed_devices": [str(d) for d in devices],
                "dtypes": dtype_names, "ops": op_names},
        tables=[("autocast policy", df)],
        notes=_notes(df, devices, dtype_names),
    )
