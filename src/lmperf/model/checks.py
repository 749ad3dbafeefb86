"""Checking a model: its parameter count, and that a user's model maps token ids (B, T) to
logits (B, T, vocab), on the meta device before anything runs and on the real device after."""

from __future__ import annotations

from typing import Callable, ContextManager

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from lmperf.errors import ModelLoadError, SpecError
from lmperf.model.custom import build_model
from lmperf.model.presets import ModelConfig

_ITEM = torch.ops.aten._local_scalar_dense.default


class AnyValues(TorchDispatchMode):
    """A value read (`.item()`, `bool(t)`) that tensors without data (meta, fake) cannot answer
    is answered 1, so that a forward that reads one (transformers' mask code checks its position
    ids) runs on shapes alone. The value does not change the shapes of a causal LM's step."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        try:
            return func(*args, **(kwargs or {}))
        except Exception:
            if func is not _ITEM:
                raise
            return 1


def count_params(model: nn.Module) -> int:
    """Number of parameter elements (shared parameters counted once)."""
    return sum(p.numel() for p in model.parameters())


def read_shape(model: nn.Module) -> dict[str, int | None]:
    """The shape of a built model read off the module, not off what its factory was handed
    (a factory may ignore it): d_model, num_layers, num_heads, d_ff, vocab_size and params
    (None where it cannot be read). A transformers model's config names them; otherwise the
    token embedding (vocab x d_model), the longest ModuleList (the blocks), the first module
    with `num_heads`, the first block's widest matrix beside d_model (d_ff)."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "hidden_size"):
        return {"d_model": config.hidden_size, "num_layers": config.num_hidden_layers,
                "num_heads": config.num_attention_heads,
                "d_ff": getattr(config, "intermediate_size", None),
                "vocab_size": config.vocab_size, "params": count_params(model)}
    embedding = next((m.weight for m in model.modules() if type(m).__name__.endswith("Embedding")
                      and getattr(getattr(m, "weight", None), "dim", lambda: 0)() == 2), None)
    vocab, d_model = tuple(embedding.shape) if embedding is not None else (None, None)
    blocks = max((m for m in model.modules() if isinstance(m, nn.ModuleList)), key=len,
                 default=None)
    heads = next((h for m in model.modules() for name in ("num_heads", "n_heads", "n_head")
                  if isinstance(h := getattr(m, name, None), int)), None)
    d_ff = max((max(p.shape) for p in blocks[0].parameters() if p.dim() == 2 and d_model in p.shape),
               default=None) if blocks and d_model else None
    return {"d_model": d_model, "num_layers": len(blocks) if blocks else None, "num_heads": heads,
            "d_ff": d_ff, "vocab_size": vocab, "params": count_params(model)}


def shape_on_meta(config: ModelConfig, custom: str | None) -> dict[str, int | None]:
    """`read_shape` of the model built on the meta device (nothing allocated)."""
    with torch.device("meta"):
        return read_shape(build_model(config, custom))


def inspect_on_meta(config: ModelConfig, custom: str | None, batch_size: int,
                    seq: int | None = None) -> int:
    """Build the model on the meta device (no memory), check it, and return its parameter count.

    For a custom model, also checks T = `seq` (default: the config's context length) against the
    `context_length` the model declares, if it declares one (SpecError), and runs a forward pass
    on meta tensors to check that token ids (B, T) map to logits (B, T, vocab_size). Raises
    ModelLoadError if they do not. Models whose forward cannot run on meta are accepted here and
    checked again on the real device.
    """
    with torch.device("meta"):
        model = build_model(config, custom)
    n = count_params(model)
    if custom is None:
        return n
    seq = seq or config.context_length
    declared = getattr(model, "context_length", None)
    if isinstance(declared, int) and not isinstance(declared, bool) and seq > declared:
        raise SpecError(f"context {seq} is longer than the model allows ({custom} has "
                        f"context_length {declared})")
    ids = torch.zeros(batch_size, seq, dtype=torch.long, device="meta")
    try:
        with AnyValues():
            out = model(ids)
    except NotImplementedError:
        return n  # an op without a meta kernel: the real run checks the output instead
    except Exception as exc:
        raise ModelLoadError(
            f"--model {custom!r}: forward failed: {type(exc).__name__}: {exc}") from exc
    check_logits(out, batch_size, seq, config.vocab_size, custom)
    return n


def check_logits(out: object, batch: int, seq: int, vocab: int, custom: str | None) -> None:
    """Raise ModelLoadError unless `out` is a tensor of shape (batch, seq, vocab) (after
    `model.custom` took the logits out of a transformers model's output)."""
    expected = (batch, seq, vocab)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        hint = (f": its vocabulary is {got[-1]}, give --vocab-size {got[-1]}"
                if isinstance(got, tuple) and len(got) == 3 and got[:2] == expected[:2] else "")
        raise ModelLoadError(f"--model {custom!r}: forward must return logits of shape "
                             f"{expected} (B, T, vocab), got {got}{hint}")


def check_output(model: nn.Module, inputs: torch.Tensor, autocast: Callable[[], ContextManager],
                 vocab: int, custom: str | None) -> None:
    """For a user's model (`custom` names it; None: the reference LM, nothing to check), run
    one forward on the real device under the run's autocast and check its logits' shape
    (B, T, vocab) against `inputs` (B, T); raises ModelLoadError. Once, untimed: a model that
    cannot run on the meta device is only checked here."""
    if custom is None:
        return
    with torch.no_grad(), autocast():
        out = model(inputs)
    check_logits(out, inputs.shape[0], inputs.shape[1], vocab, custom)
