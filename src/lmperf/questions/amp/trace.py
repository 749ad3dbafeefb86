"""Dtype flow through a model under a precision regime: module by module (forward hooks), the
loss, the grads (method: docs/precision-lab.md#trace)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F

from lmperf.questions.amp.base import ExperimentResult, dtype_name, dtype_names
from lmperf.model import ATTENTION, VOCAB_SIZE, ModelConfig, TransformerLM
from lmperf.model.presets import PRESETS, resolve_preset
from lmperf.runtime.precision import (REGIMES, autocast, get_regime, grad_scaler,
                                      slowness_warning, unsupported_reason)
from lmperf.validate import choice, positive_int
from lmperf.errors import SpecError

NAME = "trace"
SUMMARY = "dtypes of each module's inputs, outputs and parameters, then loss and grads, per regime"

_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)
_EXAMPLES = 3  # parameter names shown per gradient-dtype group


@dataclass
class _Call:
    """One forward call of one module, as the hooks saw it."""

    order: int  # entry order: parents before their children
    path: str
    module: str
    inputs: str
    output: str
    params: str
    buffers: str


def _tensors(obj: object) -> list[torch.Tensor]:
    """The tensors in a forward's arguments or output (one level of tuple/list)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for t in obj if isinstance(t, torch.Tensor)]
    return []


class DtypeRecorder:
    """Forward pre/post hooks on every module of a model, recording one _Call per call.

    A module can be shared (the LM's one RotaryEmbedding serves every layer), so a call's path is
    resolved from the module that is running it: the caller's path plus the callee's name inside
    the caller. Use as a context manager; the hooks are removed on exit.
    """

    def __init__(self, model: nn.Module):
        self.model = model
        self.calls: list[_Call] = []
        self._stack: list[tuple[str, nn.Module]] = []
        self._entries: list[int] = []  # entry numbers of the modules now running
        self._entered = 0  # modules entered so far: the order of the table's rows
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._first_alias = {id(m): n for n, m in model.named_modules()}

    def _path(self, module: nn.Module) -> str:
        if not self._stack:
            return self._first_alias.get(id(module), "")
        parent_path, parent = self._stack[-1]
        # Shortest name under the caller: 'attn.rope' inside layers.1, 'layers.1' inside the root.
        names = [n for n, m in parent.named_modules(remove_duplicate=False) if m is module and n]
        if not names:  # called by a module that does not own it
            return self._first_alias.get(id(module), type(module).__name__)
        name = min(names, key=len)
        return f"{parent_path}.{name}" if parent_path else name

    def _pre(self, module: nn.Module, args: tuple) -> None:
        self._stack.append((self._path(module), module))
        self._entries.append(self._entered)
        self._entered += 1

    def _post(self, module: nn.Module, args: tuple, output: object) -> None:
        path, _ = self._stack.pop()
        order = self._entries.pop()
        if module is self.model or isinstance(module, _CONTAINERS):
            return  # the whole model and plain containers add no dtype information
        self.calls.append(_Call(
            order=order, path=path, module=type(module).__name__,
            inputs=dtype_names(_tensors(args)), output=dtype_names(_tensors(output)),
            params=dtype_names(list(module.parameters())),
            buffers=dtype_names(list(module.buffers())),
        ))

    def __enter__(self) -> "DtypeRecorder":
        for m in self.model.modules():
            self._handles.append(m.register_forward_pre_hook(self._pre))
            self._handles.append(m.register_forward_hook(self._post))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


def module_table(calls: list[_Call]) -> pd.DataFrame:
    """One row per module path, in the order the modules were entered.

    Columns: path, module, calls, input_dtypes, output_dtype, param_dtypes, buffer_dtypes, note.
    param_dtypes and buffer_dtypes cover everything under the module ('-': none). A path called
    several times with different dtypes lists each distinct value, joined by ' | '.
    """
    by_path: dict[str, list[_Call]] = {}
    for c in sorted(calls, key=lambda c: c.order):
        by_path.setdefault(c.path, []).append(c)
    rows = []
    for path, cs in by_path.items():
        def distinct(attr: str) -> str:
            return " | ".join(dict.fromkeys(getattr(c, attr) for c in cs))
        rows.append({"path": path, "module": cs[0].module, "calls": len(cs),
                     "input_dtypes": distinct("inputs"), "output_dtype": distinct("output"),
                     "param_dtypes": distinct("params"), "buffer_dtypes": distinct("buffers"),
                     "note": ""})
    return pd.DataFrame(rows)


def collapse_repeats(df: pd.DataFrame, model: nn.Module) -> pd.DataFrame:
    """Fold each repeated layer of a ModuleList into one row when its rows match the first's.

    Layer i's signature is its rows with the 'prefix.i' part of each path removed; a layer whose
    signature equals layer 0's is replaced by its own top row, with a note naming what it
    matches. Layers that differ keep all their rows.
    """
    drop: set[int] = set()
    notes: dict[int, str] = {}
    cols = ["module", "calls", "input_dtypes", "output_dtype", "param_dtypes", "buffer_dtypes"]
    for prefix, container in model.named_modules():
        if not isinstance(container, nn.ModuleList) or len(container) < 2:
            continue

        def rows_of(i: int) -> pd.DataFrame:
            base = f"{prefix}.{i}"
            mask = (df.path == base) | df.path.str.startswith(base + ".")
            return df[mask]

        def signature(i: int) -> list[tuple]:
            part = rows_of(i)
            suffixes = part.path.str[len(f"{prefix}.{i}"):]
            return list(zip(suffixes, *(part[c] for c in cols)))

        first = signature(0)
        for i in range(1, len(container)):
            part = rows_of(i)
            if part.empty or signature(i) != first:
                continue
            top = part.index[0]
            drop.update(part.index[1:])
            notes[top] = f"same dtypes as {prefix}.0 in all {len(part) - 1} submodule rows (folded)"
    out = df.drop(index=sorted(drop)).copy()
    for idx, text in notes.items():
        out.at[idx, "note"] = text
    return out.reset_index(drop=True)


def _build(size: str, context: int, batch: int, attention: str, seed: int, device: torch.device,
           param_dtype: torch.dtype) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The LM (parameters in `param_dtype`), its (B, T) token ids and their targets."""
    # A private seed for weights and batch; forking keeps the caller's RNG stream untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        p = resolve_preset(size)
        cfg = ModelConfig(vocab_size=VOCAB_SIZE, context_length=context, d_model=p.d_model,
                          num_layers=p.num_layers, num_heads=p.num_heads, d_ff=p.d_ff,
                          attention=attention)
        net = TransformerLM(**cfg.as_kwargs())
        x = torch.randint(0, VOCAB_SIZE, (batch, context))  # (B, T) token ids
        y = torch.randint(0, VOCAB_SIZE, (batch, context))
    return net.to(device=device, dtype=param_dtype), x.to(device), y.to(device)


def trace(model: nn.Module, x: torch.Tensor, y: torch.Tensor, precision: str,
          device: torch.device) -> tuple[list[_Call], list[dict], dict[str, torch.dtype | None]]:
    """Run forward + loss under the regime's autocast, then scale -> backward.

    Returns (module calls, loss rows for the dtype table, parameter name -> grad dtype or None).
    """
    regime = get_regime(precision)
    scaler = grad_scaler(regime, device)  # disabled (a pass-through) unless the regime scales
    with torch.enable_grad():  # backward needs a graph even if the caller disabled grad mode
        with DtypeRecorder(model) as rec, autocast(regime, device):
            logits = model(x)  # (B, T, V)
            loss = F.cross_entropy(logits.flatten(0, -2), y.flatten())
        scaled = scaler.scale(loss)
        scaled.backward()
    extra = [{"path": "(loss)", "module": "cross_entropy", "calls": 1,
              "input_dtypes": dtype_name(logits.dtype), "output_dtype": dtype_name(loss.dtype),
              "param_dtypes": "-", "buffer_dtypes": "-",
              "note": "F.cross_entropy(logits, targets)"}]
    if scaler.is_enabled():
        extra.append({"path": "(scaled loss)", "module": "GradScaler.scale", "calls": 1,
                      "input_dtypes": dtype_name(loss.dtype),
                      "output_dtype": dtype_name(scaled.dtype), "param_dtypes": "-",
                      "buffer_dtypes": "-",
                      "note": f"backward runs from loss x {scaler.get_scale():g}"})
    grads = {n: (p.grad.dtype if p.grad is not None else None)
             for n, p in model.named_parameters()}
    return rec.calls, extra, grads


def grad_table(model: nn.Module, grads: dict[str, torch.dtype | None]) -> pd.DataFrame:
    """Gradients grouped by (param dtype, grad dtype): tensors, elements, a few example names."""
    params = dict(model.named_parameters())
    groups: dict[tuple[str, str], list[str]] = {}
    for name, g in grads.items():
        key = (dtype_name(params[name].dtype), dtype_name(g) if g is not None else "none")
        groups.setdefault(key, []).append(name)
    return pd.DataFrame([
        {"param_dtype": pd_, "grad_dtype": gd, "tensors": len(names),
         "elements": sum(params[n].numel() for n in names),
         "examples": ", ".join(names[:_EXAMPLES]) + (", ..." if len(names) > _EXAMPLES else "")}
        for (pd_, gd), names in groups.items()
    ])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options: --size, --precision, --context, --batch, --attention, --seed, --full."""
    parser.add_argument("--size", default="tiny",
                        help=f"LM preset: {', '.join(PRESETS)} (default: tiny)")
    parser.add_argument("--precision", default="bf16-mixed",
                        help=f"regime: {', '.join(REGIMES)} (default: bf16-mixed)")
    parser.add_argument("--context", type=int, default=16, help="LM sequence length (default: 16)")
    parser.add_argument("--batch", type=int, default=2, help="batch size (default: 2)")
    parser.add_argument("--attention", default="naive",
                        help=f"LM attention: {', '.join(ATTENTION)} (default: naive)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of weights and batch (default: 0)")
    parser.add_argument("--full", action="store_true",
                        help="list every layer's rows instead of folding the layers whose "
                             "dtypes match layer 0's")


def _set(df: pd.DataFrame, col: str, module: str) -> list[str]:
    return sorted(set(df[df.module == module][col]))


def _notes(df: pd.DataFrame, grads: pd.DataFrame, precision: str, device: torch.device,
           collapsed: bool) -> list[str]:
    modules = df[~df.path.str.startswith("(")]
    loss = df[df.path == "(loss)"].iloc[0]
    params = sorted(set(", ".join(modules.param_dtypes).replace(" | ", ", ").split(", ")) - {"-"})
    notes = [f"Under {precision} on {device.type}: parameters are {', '.join(params)}; the loss "
             f"is {loss.output_dtype} (from {loss.input_dtypes} logits); gradients are "
             f"{', '.join(sorted(set(grads.grad_dtype)))}."]
    for kind in ("Linear", "RMSNorm", "LayerNorm", "Embedding"):
        if kind in set(modules.module):
            notes.append(f"{kind} modules: inputs {', '.join(_set(modules, 'input_dtypes', kind))}"
                         f" -> outputs {', '.join(_set(modules, 'output_dtype', kind))}.")
    changed = modules[(modules.input_dtypes != modules.output_dtype)
                      & ~modules.input_dtypes.str.startswith("int")]
    if not changed.empty:
        notes.append("Modules whose output dtype differs from their input: " + "; ".join(
            f"{r.path} ({r.module}) {r.input_dtypes} -> {r.output_dtype}"
            for r in changed.itertuples()) + ".")
    blocks = modules[modules.module == "TransformerBlock"]
    if not blocks.empty:
        notes.append(f"The residual stream (each block's output) is "
                     f"{', '.join(sorted(set(blocks.output_dtype)))}.")
    if collapsed:
        notes.append("Rows of a repeated layer whose dtypes all match layer 0's are folded into "
                     "that layer's top row (see note); --full lists every row.")
    return notes


def check(device: torch.device, size: str = "tiny",
          precision: str = "bf16-mixed", context: int = 16, batch: int = 2,
          attention: str = "naive", seed: int = 0, full: bool = False) -> None:
    """Raise SpecError for a bad option or a regime this device cannot run (called before the
    experiment runs anywhere)."""
    try:
        regime = get_regime(precision)
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    resolve_preset(size)  # ValueError naming the presets
    choice("attention", attention, ATTENTION)
    positive_int("context", context)
    positive_int("batch", batch)
    reason = unsupported_reason(regime, device)
    if reason:
        raise SpecError(f"--precision {precision} cannot run here: {reason}")


def run(device: torch.device, size: str = "tiny", precision: str = "bf16-mixed",
        context: int = 16, batch: int = 2, attention: str = "naive", seed: int = 0,
        full: bool = False) -> ExperimentResult:
    """Trace dtypes through one training step's forward, loss and backward under `precision`.

    Returns an ExperimentResult with tables "module dtypes" (path, module, calls, input_dtypes,
    output_dtype, param_dtypes, buffer_dtypes, note; then the loss rows) and "gradient dtypes"
    (param_dtype, grad_dtype, tensors, elements, examples). Raises SpecError for a bad option
    or a regime this device cannot run.
    """
    check(device, size, precision, context, batch, attention, seed, full)
    regime = get_regime(precision)
    net, x, y = _build(size, context, batch, attention, seed, device, regime.param_dtype)
    calls, extra, grads = trace(net, x, y, precision, device)
    table = module_table(calls)
    folded = table if full else collapse_repeats(table, net)
    df = pd.concat([folded, pd.DataFrame(extra)], ignore_index=True)
    gtab = grad_table(net, grads)
    notes = _notes(df, gtab, precision, device, collapsed=len(folded) < len(table))
    if warning := slowness_warning(regime, device):
        notes.append(warning)
    return ExperimentResult(
        experiment=NAME,
        params={"device": device.type, "size": size, "precision": precision, "context": context,
                "batch": batch, "attention": attention, "seed": seed, "full": full},
        tables=[("module dtypes", df), ("gradient dtypes", gtab)],
        notes=notes,
    )
