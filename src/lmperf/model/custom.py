"""Building the model for a run: the reference LM, or a user's own `package.module:factory`."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Callable

import torch
import torch.nn as nn

from lmperf.errors import ModelLoadError
from lmperf.model.presets import ModelConfig
from lmperf.model.transformer import TransformerLM

Factory = Callable[[ModelConfig], nn.Module]


def load_factory(target: str) -> Factory:
    """Import `package.module:factory` and return the callable; raises ModelLoadError."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ModelLoadError(f"--model {target!r} must look like package.module:factory")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        # The console script does not put the working directory on sys.path as `python -m`
        # does; add it so that a user's module beside them resolves the same either way.
        sys.path.append(cwd)
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # ImportError, or anything the module does on import
        raise ModelLoadError(f"--model {target!r}: cannot import {module_name!r}: {exc}") from exc
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise ModelLoadError(f"--model {target!r}: {module_name!r} has no callable {attr!r}")
    return factory


def build_model(config: ModelConfig, custom: str | None = None) -> nn.Module:
    """Build the model on the current default device: the reference LM or the user's factory."""
    if custom is None:
        return TransformerLM(**config.as_kwargs())
    factory = load_factory(custom)
    try:
        model = factory(config)
    except (Exception, SystemExit) as exc:
        raise ModelLoadError(f"--model {custom!r}: the factory raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(model, nn.Module):
        raise ModelLoadError(
            f"--model {custom!r}: the factory returned {type(model).__name__}, not an nn.Module"
        )
    return model


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
        out = model(ids)
    except NotImplementedError:
        return n  # an op without a meta kernel: the real run checks the output instead
    except Exception as exc:
        raise ModelLoadError(f"--model {custom!r}: forward failed: {type(exc).__name__}: {exc}") from exc
    check_logits(out, batch_size, seq, config.vocab_size, custom)
    return n


def check_logits(out: object, batch: int, seq: int, vocab: int, custom: str | None) -> None:
    """Raise ModelLoadError unless `out` is a tensor of shape (batch, seq, vocab)."""
    expected = (batch, seq, vocab)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ModelLoadError(
            f"--model {custom!r}: forward must return logits of shape {expected} (B, T, vocab), got {got}"
        )
