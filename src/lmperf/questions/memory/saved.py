"""Saved-for-backward accounting: what autograd keeps per block, measured with saved_tensors_hooks.

One forward + loss runs under `torch.autograd.graph.saved_tensors_hooks`; the pack hook sees
every tensor autograd saves for backward (nothing is unpacked, no backward runs). Each storage
counts once, by `kind`; parameters, buffers and inputs are listed but never counted as
activations. The rules (bytes, kind, op, group, the meta device): docs/commands/memory.md,
"What autograd saves: the counting rules".
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Callable, ContextManager

import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F

from lmperf.workload.spec import RunSpec
from lmperf.model.custom import build_model
from lmperf.runtime import device as dev
from lmperf.runtime.precision import autocast, get_regime
from lmperf.model.checkpointing import set_checkpointing
from lmperf.model.float8 import convert_float8
from lmperf.units import MIB

KINDS: tuple[str, ...] = ("activation", "weight copy", "parameter", "buffer", "input")
OUTSIDE = "outside the loss graph"


@dataclass(frozen=True)
class SavedTensor:
    """One save: a tensor autograd keeps for backward (one row per pack-hook call)."""

    order: int  # position in the forward
    group: str  # 'layers.0', 'ln_final', 'lm_head', 'loss', 'model', 'token_embeddings'
    module: str  # full module path at pack time ('' for the model itself or the loss)
    op: str  # autograd node without 'Backward0' + argument, e.g. 'Mm.mat2'
    shape: tuple[int, ...]
    dtype: str
    kind: str  # one of KINDS
    bytes: int  # storage bytes counted here; 0 when the storage was already counted


@dataclass
class SavedReport:
    """Every save of one forward + loss, and the residual-stream size as a yardstick.

    `residual_bytes`: bytes of one (B, T, C) output of the first block (the residual stream in
    its dtype); 0 if the model has no ModuleList of blocks.
    """

    tensors: list[SavedTensor]
    residual_bytes: int
    device: str

    def frame(self) -> pd.DataFrame:
        """One row per save, with `MiB` (counted storage bytes / 2**20)."""
        df = pd.DataFrame([t.__dict__ for t in self.tensors])
        if not df.empty:
            df["MiB"] = df["bytes"] / MIB
        return df

    def total(self, kind: str = "activation") -> int:
        """Counted bytes of one kind (each storage once)."""
        return sum(t.bytes for t in self.tensors if t.kind == kind)

    def group_bytes(self, kind: str = "activation") -> dict[str, int]:
        """Counted bytes of `kind` per group, in forward order."""
        out: dict[str, int] = {}
        for t in self.tensors:
            out[t.group] = out.get(t.group, 0) + (t.bytes if t.kind == kind else 0)
        return out

    def block_bytes(self) -> dict[str, int]:
        """Activation bytes of each Transformer block (groups named `<list>.<index>`)."""
        return {g: b for g, b in self.group_bytes().items() if re.fullmatch(r".+\.\d+", g)}

    def by_group(self) -> pd.DataFrame:
        """Per group: activations, autocast weight copies, saves, and activations / residual."""
        acts, copies = self.group_bytes("activation"), self.group_bytes("weight copy")
        rows = []
        for g in acts:
            n = sum(t.group == g for t in self.tensors)
            rows.append({"group": g, "activations MiB": acts[g] / MIB,
                         "weight copies MiB": copies[g] / MIB, "saves": n,
                         "x residual": (acts[g] / self.residual_bytes
                                        if self.residual_bytes else None)})
        total = self.total()
        rows.append({"group": "total", "activations MiB": total / MIB,
                     "weight copies MiB": self.total("weight copy") / MIB,
                     "saves": len(self.tensors),
                     "x residual": total / self.residual_bytes if self.residual_bytes else None})
        return pd.DataFrame(rows)

    def top(self, n: int = 10, group: str | None = None) -> pd.DataFrame:
        """The `n` largest counted activation storages (of one `group`, e.g. "layers.0", or of
        all) with their share of all activations."""
        df = self.frame()
        if df.empty:
            return df
        df = df[(df["kind"] == "activation") & (df["bytes"] > 0)]
        if group is not None:
            df = df[df["group"] == group]
        df = df.sort_values("bytes", ascending=False, kind="stable").head(n)
        total = self.total() or 1
        return pd.DataFrame({"group": df["group"], "module": df["module"], "op": df["op"],
                             "shape": [str(tuple(s)) for s in df["shape"]], "dtype": df["dtype"],
                             "MiB": df["MiB"], "share": df["bytes"] / total})


def _storage(t: torch.Tensor) -> tuple[int, int]:
    """(identity, bytes) of the storage behind `t`; a storage-less tensor is its own storage."""
    try:
        s = t.untyped_storage()
        return s._cdata, s.nbytes()
    except (RuntimeError, NotImplementedError):
        return id(t), t.numel() * t.element_size()


# Autograd nodes of a cast or a view: what lies between a parameter and autocast's copy of it.
_CAST_OR_VIEW = re.compile(r"(ToCopy|T|View|UnsafeView|ReshapeAlias|Transpose|Permute|Expand|Alias)"
                           r"Backward\d*")


def _is_weight_copy(t: torch.Tensor, param_ids: set[int], depth: int = 4) -> bool:
    """Whether `t` is a cast of one parameter (through views), as autocast makes for a matmul."""
    fn, cast = t.grad_fn, False
    for _ in range(depth):
        if fn is None:
            return False
        if hasattr(fn, "variable"):  # AccumulateGrad: reached a leaf
            return cast and id(fn.variable) in param_ids
        name = fn.name()
        if not _CAST_OR_VIEW.fullmatch(name):
            return False
        cast = cast or name.startswith("ToCopy")
        inputs = [f for f, _ in fn.next_functions if f is not None]
        if len(inputs) != 1:
            return False
        fn = inputs[0]
    return False


def _saving_ops(root, unpack: Callable) -> dict[int, str]:
    """Pack-hook index -> 'Node.argument', walking the graph from `root` without unpacking."""
    ops: dict[int, str] = {}
    seen: set = set()
    todo = [root]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        name = re.sub(r"Backward\d*$", "", fn.name())
        for attr in dir(fn):
            if not attr.startswith("_raw_saved_"):
                continue
            raw = getattr(fn, attr)
            for r in raw if isinstance(raw, (list, tuple)) else [raw]:
                # only our handles: r.data is the index our pack hook returned
                if getattr(r, "unpack_hook", None) is unpack:
                    ops.setdefault(r.data, f"{name}.{attr[len('_raw_saved_'):]}")
        todo.extend(f for f, _ in fn.next_functions)
    return ops


def _group(path: str) -> str:
    """'layers.3.attn.q_proj' -> 'layers.3'; 'ln_final' -> 'ln_final'; '' -> 'model'."""
    if not path:
        return "model"
    parts = path.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and parts[1].isdigit() else parts[0]


def measure_saved(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                  autocast: Callable[[], ContextManager] = contextlib.nullcontext) -> SavedReport:
    """Run one forward + cross-entropy loss of `model` and account for every saved tensor.

    `inputs`, `targets`: token ids (B, T); `autocast`: a factory for the context wrapping
    forward and loss (as in `StepState`). Grad must be enabled; no backward runs and nothing
    is kept after return. Returns a SavedReport (bytes as described in the module docstring).
    """
    saved: list[torch.Tensor] = []  # kept alive until counted: storages cannot be reused
    paths: list[str] = []
    stack: list[str] = []
    state = {"done": False, "residual": 0}
    # A module shared by several parents (the reference LM's one RoPE module) has one path per
    # parent; the hook picks the one under the module that is running.
    names: dict[nn.Module, list[str]] = {}
    for n, m in model.named_modules(remove_duplicate=False):
        names.setdefault(m, []).append(n)

    def pre(module: nn.Module, args: object) -> None:
        parent = stack[-1] + "." if stack and stack[-1] else ""
        paths_of = names[module]
        stack.append(next((p for p in paths_of if p.startswith(parent)), paths_of[0]))

    def post(module: nn.Module, args: object, out: object) -> None:
        path = stack.pop()
        first_block = re.fullmatch(r"\w+\.0", path) and isinstance(out, torch.Tensor)
        if first_block and not state["residual"]:
            state["residual"] = out.numel() * out.element_size()  # the first block's (B, T, C)

    def pack(t: torch.Tensor) -> int:
        saved.append(t)
        paths.append("<loss>" if state["done"] else (stack[-1] if stack else ""))
        return len(saved) - 1

    def unpack(i: int) -> torch.Tensor:
        return saved[i]

    handles = [h for m in names for h in (m.register_forward_pre_hook(pre),
                                          m.register_forward_hook(post))]
    try:
        hooks = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
        with torch.enable_grad(), hooks, autocast():
            logits = model(inputs)  # (B, T, V)
            state["done"] = True
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        ops = _saving_ops(loss.grad_fn, unpack)
    finally:
        for h in handles:
            h.remove()
    del logits, loss

    param_keys = {_storage(p)[0] for p in model.parameters()}
    param_ids = {id(p) for p in model.parameters()}
    buffer_keys = {_storage(b)[0] for b in model.buffers()}
    input_keys = {_storage(inputs)[0], _storage(targets)[0]}
    counted: set[int] = set()
    rows = []
    for i, (t, path) in enumerate(zip(saved, paths)):
        key, nbytes = _storage(t)
        if key in param_keys:
            kind = "parameter"
        elif key in buffer_keys:
            kind = "buffer"
        elif key in input_keys:
            kind = "input"
        elif _is_weight_copy(t, param_ids):
            kind = "weight copy"
        else:
            kind = "activation"
        first = key not in counted
        counted.add(key)
        rows.append(SavedTensor(
            order=i, group="loss" if path == "<loss>" else _group(path),
            module="" if path == "<loss>" else path, op=ops.get(i, OUTSIDE),
            shape=tuple(t.shape), dtype=str(t.dtype).removeprefix("torch."), kind=kind,
            bytes=nbytes if first else 0))
    device = str(inputs.device)
    return SavedReport(rows, state["residual"], device)


def meta_equivalent(spec: RunSpec) -> bool:
    """Whether the meta device saves the same bytes as the spec's device: the reference LM with
    naive attention, no autocast and no float8 (autocast has no meta device; SDPA on meta takes
    the math path, which saves what the fused kernels do not; torchao's float8 is measured where
    it runs)."""
    return (spec.model is None and spec.attention == "naive" and spec.float8 == "none"
            and get_regime(spec.precision).autocast_dtype is None)


def measure_spec(spec: RunSpec, device: torch.device,
                 checkpoint: str | int = "none") -> SavedReport:
    """Build the spec's model on `device` (the meta device allocates nothing) and measure it.

    Uses a random (B, T) batch of the spec (zeros on meta); `checkpoint` (a policy, not the
    spec's) turns on activation checkpointing and raises SpecError for a model without it;
    the spec's float8 converts its Linear layers.
    """
    with device:
        model = build_model(spec.model_config(), spec.model)
    regime = get_regime(spec.precision)
    model.to(dtype=regime.param_dtype)
    convert_float8(model, spec.float8)
    set_checkpointing(model, checkpoint)
    shape = (spec.batch, spec.context)
    if device.type == "meta":
        inputs = torch.zeros(shape, dtype=torch.long, device=device)
        targets = torch.zeros(shape, dtype=torch.long, device=device)
        context = contextlib.nullcontext
    else:
        gen = dev.make_generator(device, spec.seed)
        inputs = torch.randint(0, spec.vocab_size, shape, generator=gen, device=device)
        targets = torch.randint(0, spec.vocab_size, shape, generator=gen, device=device)
        context = lambda: autocast(regime, device)  # noqa: E731
    return measure_saved(model, inputs, targets, context)
