"""Building the model for a run: the reference LM, or a user's own `package.module:factory`
(checking what it returns: `lmperf.model.checks`). A user's model may return what transformers'
models return: its logits are taken from it (`_logits_of`)."""

from __future__ import annotations

import importlib
import inspect
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
    if custom is not None:
        factory = load_factory(custom)
        try:
            model = factory(config)
        except (Exception, SystemExit) as exc:
            raise ModelLoadError(f"--model {custom!r}: the factory raised {type(exc).__name__}: "
                                 f"{exc}") from exc
        if not isinstance(model, nn.Module):
            raise ModelLoadError(
                f"--model {custom!r}: the factory returned {type(model).__name__}, not an nn.Module"
            )
        # Hugging Face's models return an output object (or a tuple) holding the logits
        model.register_forward_hook(_logits_of)
        if "use_cache" in inspect.signature(model.forward).parameters:
            # a training step has no use for a KV cache (transformers' default keeps one)
            model.register_forward_pre_hook(_no_cache, with_kwargs=True)
        return model
    return TransformerLM(**config.as_kwargs())


def _no_cache(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A forward pre-hook: call the model with use_cache=False."""
    return args, {**kwargs, "use_cache": False}


def _logits_of(module: nn.Module, args: tuple, out: object) -> torch.Tensor | None:
    """A forward hook on a user's model: what transformers' causal LMs return (an object with
    `.logits`, or a tuple / list led by them: return_dict=False) becomes its logits, so every
    consumer of forward sees a tensor; a tensor (or anything else) passes unchanged (None)."""
    if isinstance(out, torch.Tensor):
        return None
    logits = getattr(out, "logits", None)
    if logits is None and isinstance(out, (tuple, list)) and out:
        logits = out[0]
    return logits if isinstance(logits, torch.Tensor) else None
