"""Checking a model: its parameter count, and that a user's model maps token ids (B, T) to
logits (B, T, vocab), on the meta device before anything runs and on the real device after."""

from __future__ import annotations

from typing import Callable, ContextManager

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from lmperf.errors import ModelLoadError
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


def inspect_on_meta(config: ModelConfig, custom: str | None, batch_size: int,
                    seq: int | None = None) -> int:
    """Build the model on the meta device (no memory), check it, and return its parameter count.

    For a custom model, also runs a forward pass on meta tensors to check that token ids (B, T),
    T = `seq` (default: the config's context length),
    map to logits (B, T, vocab_size). Raises ModelLoadError if it does not. Models whose forward
    cannot run on meta are accepted here and checked again on the real device.
    """
    with torch.device("meta"):
        model = build_model(config, custom)
    n = count_params(model)
    if custom is None:
        return n
    seq = seq or config.context_length
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
        raise ModelLoadError(f"--model {custom!r}: forward must return logits of shape "
                             f"{expected} (B, T, vocab), got {got}")


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
