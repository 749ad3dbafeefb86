"""Gradient underflow in fp16 and bf16, and what loss scaling and GradScaler do about it: (a) a
synthetic population cast after scaling by S, (b) a real fp16 backward, (c) GradScaler over a few
steps with an injected inf (method: docs/precision-lab.md#underflow)."""

from __future__ import annotations

import argparse
import math
import os

import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F

from lmperf.questions.amp.base import ExperimentResult, dtype_name
from lmperf.runtime import device as dev
from lmperf.validate import finite_number, positive_floats, positive_int
from lmperf.errors import SpecError

NAME = "underflow"
SUMMARY = "gradient underflow in fp16/bf16, loss scaling by S, and GradScaler's backoff and growth"

LOW_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16)
DEFAULT_SCALES: tuple[float, ...] = (1.0, 2.0**8, 2.0**16, 2.0**24)
POPULATION_RANGE: tuple[float, float] = (1e-12, 1e2)  # magnitudes of the synthetic gradients
MLP_DIMS: tuple[int, ...] = (32, 64, 64, 1)  # in -> hidden -> hidden -> out
BATCH = 64
HIST_BIN_DECADES = 0.25  # histogram bin width in log10 units
# GradScaler starts at 2**16 by default; there this MLP's own fp16 gradients overflow after one
# growth (seen on the CPU when this was written; --init-scale 65536 shows it), which would mix
# real backoffs into the injected one. A lower start keeps the table to the injected inf.
DEFAULT_INIT_SCALE = 2.0**10


# ---------------------------------------------------------------- (a) synthetic population

def gradient_population(count: int, seed: int, low: float = POPULATION_RANGE[0],
                        high: float = POPULATION_RANGE[1]) -> torch.Tensor:
    """`count` fp64 values on the CPU: |g| log-uniform in [low, high], sign + or - at random."""
    gen = dev.make_generator(torch.device("cpu"), seed)
    log_mag = torch.empty(count, dtype=torch.float64).uniform_(math.log10(low), math.log10(high),
                                                               generator=gen)
    sign = torch.randint(0, 2, (count,), generator=gen, dtype=torch.float64) * 2 - 1
    return sign * torch.pow(10.0, log_mag)


def format_thresholds(dtype: torch.dtype, device: torch.device) -> dict[str, float]:
    """The dtype's smallest subnormal, smallest normal and largest finite value (read on `device`).

    The smallest subnormal is the value after 0 (torch.nextafter); anything at or below half of it
    rounds to zero when cast ("flush_below").
    """
    zero = torch.zeros((), dtype=dtype, device=device)
    smallest_subnormal = torch.nextafter(zero, torch.ones_like(zero)).item()
    info = torch.finfo(dtype)
    return {"smallest_subnormal": smallest_subnormal, "smallest_normal": info.tiny,
            "largest_finite": info.max, "flush_below": smallest_subnormal / 2}


def cast_fractions(values: torch.Tensor, dtype: torch.dtype, scale: float,
                   device: torch.device) -> dict[str, float]:
    """Fractions of the nonzero `values` (fp64) that, multiplied by `scale` and cast to `dtype` on
    `device`, became 0 (flushed), subnormal, inf (overflowed) or stayed normal."""
    nonzero = values[values != 0]
    cast = (nonzero * scale).to(device).to(dtype)
    mag = cast.abs()
    flushed = mag == 0
    overflowed = torch.isinf(cast)
    subnormal = (mag > 0) & (mag < torch.finfo(dtype).tiny)
    n = nonzero.numel()
    frac = lambda mask: mask.sum().item() / n  # noqa: E731
    return {"flushed_fraction": frac(flushed), "subnormal_fraction": frac(subnormal),
            "overflow_fraction": frac(overflowed),
            "normal_fraction": frac(~(flushed | subnormal | overflowed))}


def population_table(device: torch.device, population: torch.Tensor,
                     scales: list[float]) -> pd.DataFrame:
    """What casting S * g to fp16 and bf16 does to the population, per scale S."""
    rows = []
    for scale in scales:
        for dtype in LOW_DTYPES:
            rows.append({"scale": scale, "log2_scale": math.log2(scale), "dtype": dtype_name(dtype),
                         **cast_fractions(population, dtype, scale, device)})
    return pd.DataFrame(rows)


def histogram_table(population: torch.Tensor, scale: float) -> pd.DataFrame:
    """Counts of log10|g| and of log10|S g| in bins HIST_BIN_DECADES wide (fp64, exact values)."""
    logs = population.abs().log10()
    shifted = logs + math.log10(scale)
    lo = math.floor(min(logs.min().item(), shifted.min().item()))
    hi = math.ceil(max(logs.max().item(), shifted.max().item()))
    bins = round((hi - lo) / HIST_BIN_DECADES)
    edges = torch.linspace(lo, hi, bins + 1, dtype=torch.float64)
    count = lambda v: torch.histc(v, bins=bins, min=lo, max=hi).long().tolist()  # noqa: E731
    return pd.DataFrame({"log10_abs_grad_low": edges[:-1].tolist(), "log10_abs_grad_high": edges[1:].tolist(),
                         "count_unscaled": count(logs), "count_scaled": count(shifted)})


# ---------------------------------------------------------------- (b) a real backward pass

def make_mlp(seed: int, dtype: torch.dtype, device: torch.device) -> nn.Sequential:
    """Linear-GELU-Linear-GELU-Linear of MLP_DIMS, weights N(0, 1/fan_in) from `seed`, zero biases.

    Built with skip_init and filled from a private generator, so torch's global RNG is not used.
    """
    gen = dev.make_generator(torch.device("cpu"), seed)
    layers: list[nn.Module] = []
    pairs = list(zip(MLP_DIMS[:-1], MLP_DIMS[1:]))
    for i, (d_in, d_out) in enumerate(pairs):
        linear = nn.utils.skip_init(nn.Linear, d_in, d_out)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(d_out, d_in, generator=gen) / math.sqrt(d_in))
            linear.bias.zero_()
        layers.append(linear)
        if i < len(pairs) - 1:
            layers.append(nn.GELU())
    return nn.Sequential(*layers).to(device=device, dtype=dtype)


def mlp_gradients(device: torch.device, seed: int, loss_factor: float, dtype: torch.dtype,
                  scale: float = 1.0) -> torch.Tensor:
    """All parameter gradients of one backward pass of the MLP, flattened, in fp32.

    Weights and math in `dtype` ("true" low precision, no autocast); the weights and input are the
    fp16-rounded values in every dtype, so runs differ only in arithmetic. The loss (MSE in fp32,
    times `loss_factor`) is multiplied by `scale` before backward, and the gradients are divided
    by it in fp32.
    """
    gen = dev.make_generator(torch.device("cpu"), seed + 1)  # a stream apart from the weights'
    x = torch.randn(BATCH, MLP_DIMS[0], generator=gen).to(device)
    y = torch.randn(BATCH, MLP_DIMS[-1], generator=gen).to(device)
    model = make_mlp(seed, torch.float16, device).to(dtype)
    out = model(x.half().to(dtype)).float()  # the loss itself in fp32, as a training loop takes it
    loss = F.mse_loss(out, y) * loss_factor
    (loss * scale).backward()
    grads = torch.cat([p.grad.detach().float().flatten() for p in model.parameters()])
    return grads / scale  # unscale in fp32


def backward_table(device: torch.device, seed: int, loss_factor: float,
                   scales: list[float]) -> pd.DataFrame:
    """fp16-true backward scaled by each S (and bf16-true unscaled), against the fp32 reference."""
    ref = mlp_gradients(device, seed, loss_factor, torch.float32)
    rows = [_grad_row("fp32 reference", 1.0, ref, ref)]
    for scale in scales:
        g = mlp_gradients(device, seed, loss_factor, torch.float16, scale)
        rows.append(_grad_row("fp16-true", scale, g, ref))
    # bf16 for contrast, unscaled: its exponent range is fp32's, so nothing should flush
    bf16 = mlp_gradients(device, seed, loss_factor, torch.bfloat16)
    rows.append(_grad_row("bf16-true", 1.0, bf16, ref))
    return pd.DataFrame(rows)


def _grad_row(variant: str, scale: float, g: torch.Tensor, ref: torch.Tensor) -> dict:
    finite = torch.isfinite(g)
    return {
        "variant": variant, "scale": scale,
        "zero_fraction": (g == 0).float().mean().item(),
        "flushed_fraction": ((g == 0) & (ref != 0)).float().mean().item(),
        "nonfinite_fraction": (~finite).float().mean().item(),
        "median_abs_grad": g.abs().median().item(),
        "rel_error": ((g.double() - ref.double()).norm() / ref.double().norm()).item(),
    }


# ---------------------------------------------------------------- (c) GradScaler dynamics

def grad_scaler_table(device: torch.device, seed: int, steps: int, inf_step: int,
                      growth_interval: int, init_scale: float = DEFAULT_INIT_SCALE) -> pd.DataFrame:
    """`steps` AMP steps (fp32 MLP, fp16 autocast, SGD) with GradScaler; at step `inf_step` a hook
    multiplies the first layer's weight gradient by inf.

    The scaler is built here rather than with lmperf.runtime.precision.grad_scaler: that one keeps
    torch's growth_interval of 2000 steps (and its init_scale of 2**16), so no growth would show
    within a dozen steps.
    """
    model = make_mlp(seed, torch.float32, device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler(device.type, init_scale=init_scale, growth_factor=2.0,
                                  backoff_factor=0.5, growth_interval=growth_interval)
    current = {"step": 0}
    first = model[0].weight
    # Hook on the parameter: runs as its gradient is produced, like a real overflow would.
    handle = first.register_hook(lambda g: g * math.inf if current["step"] == inf_step else g)
    gen = dev.make_generator(torch.device("cpu"), seed + 2)
    rows = []
    try:
        for step in range(1, steps + 1):
            current["step"] = step
            x = torch.randn(BATCH, MLP_DIMS[0], generator=gen).to(device)
            y = torch.randn(BATCH, MLP_DIMS[-1], generator=gen).to(device)
            before = [p.detach().clone() for p in model.parameters()]
            scale = scaler.get_scale()  # reads the scale tensor: a device sync on CUDA
            with torch.autocast(device_type=device.type, dtype=torch.float16):
                loss = F.mse_loss(model(x).float(), y)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)  # grads now in true units; inf/nan recorded per device
            grads_finite = all(torch.isfinite(p.grad).all().item() for p in model.parameters())
            scaler.step(opt)  # skipped when unscale_ found inf/nan
            scaler.update()  # backoff after a skipped step, growth after growth_interval clean ones
            opt.zero_grad(set_to_none=True)
            unchanged = all(torch.equal(b, p.detach()) for b, p in zip(before, model.parameters()))
            after = scaler.get_scale()
            rows.append({"step": step, "scale": scale, "inf_injected": step == inf_step,
                         "grads_finite": grads_finite, "step_skipped": unchanged,
                         "scale_after": after, "scale_factor": after / scale})
    finally:
        handle.remove()
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- options, run, notes, plot

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The experiment's options (each with a default)."""
    parser.add_argument("--count", type=int, default=100_000,
                        help="size of the synthetic gradient population (default: 100000)")
    parser.add_argument("--scales", type=float, nargs="+", default=list(DEFAULT_SCALES), metavar="S",
                        help="loss scales to compare (default: 1 2**8 2**16 2**24)")
    parser.add_argument("--loss-factor", type=float, default=1e-5,
                        help="multiplies the MLP's loss so its gradients are small (default: 1e-5)")
    parser.add_argument("--steps", type=int, default=12, help="GradScaler steps (default: 12)")
    parser.add_argument("--inf-step", type=int, default=4,
                        help="the step whose gradient is made inf (default: 4)")
    parser.add_argument("--growth-interval", type=int, default=3,
                        help="clean steps before GradScaler doubles its scale (default: 3)")
    parser.add_argument("--init-scale", type=float, default=DEFAULT_INIT_SCALE,
                        help="GradScaler's starting scale (default: 2**10)")
    parser.add_argument("--seed", type=int, default=0, help="seed of population, weights, data (default: 0)")


def check(device: torch.device, count: int = 100_000, scales: list[float] | None = None,
          loss_factor: float = 1e-5, steps: int = 12, inf_step: int = 4, growth_interval: int = 3,
          init_scale: float = DEFAULT_INIT_SCALE,
          seed: int = 0) -> tuple[list[float], float, float]:
    """Raise SpecError for a bad option (called before the experiment runs anywhere); return
    the scales (ascending), the loss factor and the initial scale, as floats."""
    for flag, value in (("--count", count), ("--steps", steps),
                        ("--growth-interval", growth_interval), ("--inf-step", inf_step)):
        positive_int(flag, value)
    if inf_step > steps:
        raise SpecError(f"--inf-step must be at most --steps ({steps}), got {inf_step}")
    return (positive_floats("--scales", sorted(
                float(s) for s in (DEFAULT_SCALES if scales is None else scales))),
            finite_number("--loss-factor", loss_factor, positive=True),
            finite_number("--init-scale", init_scale, positive=True))


def run(device: torch.device, count: int = 100_000, scales: list[float] | None = None,
        loss_factor: float = 1e-5, steps: int = 12, inf_step: int = 4, growth_interval: int = 3,
        init_scale: float = DEFAULT_INIT_SCALE, seed: int = 0) -> ExperimentResult:
    """Run the underflow experiment on `device`; raises SpecError for a bad option."""
    scales, loss_factor, init_scale = check(device, count, scales, loss_factor, steps, inf_step,
                                            growth_interval, init_scale, seed)
    seed = int(seed)

    thresholds = pd.DataFrame([{"dtype": dtype_name(d), **format_thresholds(d, device)}
                               for d in LOW_DTYPES])
    population = gradient_population(count, seed)
    pop_df = population_table(device, population, scales)
    fp16 = pop_df[pop_df["dtype"] == "float16"]
    lost = fp16["flushed_fraction"] + fp16["overflow_fraction"]
    plot_scale = float(fp16.loc[lost.idxmin(), "scale"])  # the S losing fewest values in fp16
    hist_df = histogram_table(population, plot_scale)
    back_df = backward_table(device, seed, loss_factor, scales)
    scaler_df = grad_scaler_table(device, seed, steps, inf_step, growth_interval, init_scale)
    result = ExperimentResult(
        NAME,
        {"device": device.type, "count": count, "scales": scales, "loss_factor": loss_factor,
         "steps": steps, "inf_step": inf_step, "growth_interval": growth_interval, "seed": seed,
         "population_range": list(POPULATION_RANGE), "plot_scale": plot_scale,
         "mlp_dims": list(MLP_DIMS), "batch": BATCH, "init_scale": init_scale},
        [("format thresholds", thresholds),
         ("synthetic gradients cast after scaling by S", pop_df),
         (f"log10|g| histogram (unscaled and times S = {plot_scale:g})", hist_df),
         (f"fp16-true MLP backward, loss x {loss_factor:g}", back_df),
         ("GradScaler per step", scaler_df)],
    )
    result.notes = _notes(result)
    return result


def _s(scale: float) -> str:
    """'2^16' for powers of two above 1, else the number."""
    e = math.log2(scale)
    return f"2^{int(e)}" if e == int(e) and e > 0 else f"{scale:g}"


def _notes(result: ExperimentResult) -> list[str]:
    p = result.params
    notes = []
    thr = result.table("format thresholds").set_index("dtype")
    pop = result.table("synthetic gradients cast after scaling by S")
    first = pop[pop["scale"] == pop["scale"].min()].set_index("dtype")
    s0 = _s(first["scale"].iloc[0])
    fp16 = pop[pop["dtype"] == "float16"].set_index("scale")
    best = fp16.loc[p["plot_scale"]]
    notes.append(  # the answer first: it is the report's headline
        f"Gradients log-uniform in [{p['population_range'][0]:g}, {p['population_range'][1]:g}], "
        f"cast with S = {s0}: float16 flushes {first.loc['float16', 'flushed_fraction']:.1%} to zero "
        f"(|g| <= {thr.loc['float16', 'flush_below']:.3g}) and leaves "
        f"{first.loc['float16', 'subnormal_fraction']:.1%} subnormal; bfloat16 flushes "
        f"{first.loc['bfloat16', 'flushed_fraction']:.1%} and leaves "
        f"{first.loc['bfloat16', 'subnormal_fraction']:.1%} subnormal. In float16, "
        f"S = {_s(p['plot_scale'])} loses the fewest: {best['flushed_fraction']:.1%} flushed, "
        f"{best['overflow_fraction']:.1%} overflowed.")
    span = math.log10(thr.loc["float16", "largest_finite"] / thr.loc["float16", "flush_below"])
    pop_span = math.log10(p["population_range"][1] / p["population_range"][0])
    notes.append(f"float16 spans {span:.1f} decades from flush-to-zero to overflow, the population "
                 f"{pop_span:.1f}: " + ("no single S keeps all of it." if pop_span > span else
                                        "a well-chosen S can keep all of it."))
    over = fp16[fp16["overflow_fraction"] > 0]
    if not over.empty:
        notes.append(f"Too large a scale overflows float16 instead: from S = {_s(over.index[0])} on, "
                     f"{over['overflow_fraction'].iloc[0]:.1%} of the scaled values are inf "
                     f"({over['overflow_fraction'].iloc[-1]:.1%} at S = {_s(over.index[-1])}).")
    back = result.table(f"fp16-true MLP backward, loss x {p['loss_factor']:g}")
    ref = back.iloc[0]
    fp = back[back["variant"] == "fp16-true"].set_index("scale")
    bf = back[back["variant"] == "bf16-true"].iloc[0]
    lo, hi = fp.iloc[0], fp.loc[fp["rel_error"].idxmin()]
    notes.append(
        f"fp16-true MLP backward with the loss x {p['loss_factor']:g}: at S = {_s(fp.index[0])}, "
        f"{lo['zero_fraction']:.1%} of gradient elements are exactly zero (fp32: "
        f"{ref['zero_fraction']:.1%}), median |grad| {lo['median_abs_grad']:.3g} vs "
        f"{ref['median_abs_grad']:.3g}, error {lo['rel_error']:.2%}; at S = {_s(hi.name)}, "
        f"{hi['zero_fraction']:.1%} zero and error {hi['rel_error']:.2%}. bf16-true unscaled: "
        f"{bf['zero_fraction']:.1%} zero, error {bf['rel_error']:.2%} (its precision, not its range).")
    sc = result.table("GradScaler per step")
    inj = sc[sc["inf_injected"]].iloc[0]
    notes.append(
        f"GradScaler (init {p['init_scale']:g}, growth_interval {p['growth_interval']}): at step "
        f"{inj['step']}, where inf was injected, the step was "
        f"{'skipped' if inj['step_skipped'] else 'NOT skipped'} and the scale went "
        f"{inj['scale']:g} -> {inj['scale_after']:g}.")
    grown = sc[sc["scale_factor"] > 1]
    if not grown.empty:  # each growth follows growth_interval clean steps: the table shows them
        notes.append(f"The scale grew x{grown['scale_factor'].iloc[0]:g} after step"
                     f"{'s' if len(grown) > 1 else ''} {', '.join(str(s) for s in grown['step'])}; "
                     f"final scale {sc['scale_after'].iloc[-1]:g}.")
    clean_skips = sc[sc["step_skipped"] & ~sc["inf_injected"]]
    if not clean_skips.empty:
        notes.append(f"Steps {', '.join(str(s) for s in clean_skips['step'])} were skipped without an "
                     "injected inf: their own gradients overflowed at that scale.")
    return notes


def plot(result: ExperimentResult, path: str | os.PathLike) -> None:
    """Histogram of log10|g| (unscaled and shifted by the plotted S) with each format's smallest
    subnormal, smallest normal and largest finite value as vertical lines; one panel per format."""
    from matplotlib.figure import Figure  # no pyplot: no global figure state, no backend switch

    hist = next(df for title, df in result.tables if title.startswith("log10|g| histogram"))
    thr = result.table("format thresholds")
    s = result.params["plot_scale"]
    centers = (hist["log10_abs_grad_low"] + hist["log10_abs_grad_high"]) / 2
    width = (hist["log10_abs_grad_high"] - hist["log10_abs_grad_low"]).iloc[0]
    fig = Figure(figsize=(11, 6.5), layout="constrained")
    axes = fig.subplots(len(thr), 1)
    styles = (("smallest_subnormal", ":", "smallest subnormal"), ("smallest_normal", "--", "smallest normal"),
              ("largest_finite", "-", "largest finite"))
    for ax, (_, t) in zip(axes, thr.iterrows()):
        ax.bar(centers, hist["count_unscaled"], width=width, alpha=0.5, label="|g|")
        ax.bar(centers, hist["count_scaled"], width=width, alpha=0.5, label=f"|g| x {_s(s)}")
        for key, ls, label in styles:
            ax.axvline(math.log10(t[key]), color="k", linestyle=ls, label=f"{t['dtype']} {label}")
        lo, hi = ax.get_xlim()
        ax.axvspan(lo, math.log10(t["flush_below"]), color="grey", alpha=0.2, label="cast to 0")
        ax.axvspan(math.log10(t["largest_finite"]), hi, color="red", alpha=0.1, label="cast to inf")
        ax.set_xlim(lo, hi)
        ax.set_title(f"{t['dtype']}: where gradients land")
        ax.set_xlabel("log10 |gradient|")
        ax.set_ylabel("count")
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.suptitle(f"{result.params['count']} synthetic gradients, log-uniform in "
                 f"[{result.params['population_range'][0]:g}, {result.params['population_range'][1]:g}]")
    fig.savefig(path, dpi=110)
