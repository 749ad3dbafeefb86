"""Activation checkpointing switched on a built model, whichever kind it is: the reference LM's
groups of blocks, or a transformers model's own switch (every layer or none)."""

from __future__ import annotations

import torch

from lmperf.errors import SpecError


def set_checkpointing(model: torch.nn.Module, group: int) -> None:
    """Turn the model's activation checkpointing to `group` (0: off); SpecError if it has none.
    A transformers model checkpoints every layer or none: group 1 is its
    `activation_checkpointing_enable()` (`gradient_...` before transformers 5), non-reentrant
    as the reference LM's."""
    setter = getattr(model, "set_checkpointing", None)
    if setter is None:
        if group in (0, 1) and getattr(model, "supports_gradient_checkpointing", False):
            name = "activation" if hasattr(model, "activation_checkpointing_enable") else "gradient"
            if group:
                getattr(model, f"{name}_checkpointing_enable")({"use_reentrant": False})
            else:
                getattr(model, f"{name}_checkpointing_disable")()
            return
        if group:
            raise SpecError(f"{type(model).__name__} has no set_checkpointing(group): activation "
                            "checkpointing in groups is available for the reference LM only (a "
                            "transformers model: group 1, every layer)")
        return
    try:
        setter(group)
    except ValueError as exc:
        raise SpecError(str(exc)) from None
