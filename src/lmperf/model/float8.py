"""float8 training of a model's Linear layers as torchao does it (torchao.float8's
`convert_to_float8_training` with `Float8LinearConfig.from_recipe_name`), with torchtitan's
choice of layers: every Linear but the output head, and none with a dimension that is not a
multiple of 16 (FP8 tensor cores' tile). torchao is an optional dependency (`lmperf[float8]`):
imported only here, only when float8 is asked for.
"""

from __future__ import annotations

import contextlib
import io
import logging

import torch.nn as nn

from lmperf.errors import SpecError

# The output heads left in high precision, by the name of their module (the reference LM's and
# a transformers model's lm_head, torchtitan's output).
HEADS: tuple[str, ...] = ("lm_head", "output")


def convertible(module: nn.Module, fqn: str) -> bool:
    """torchtitan's filter (`module_filter_fn`): a Linear that is not the output head, its
    in and out features multiples of 16."""
    weight = getattr(module, "weight", None)
    return (fqn.rpartition(".")[2] not in HEADS and weight is not None and weight.dim() == 2
            and weight.shape[0] % 16 == 0 and weight.shape[1] % 16 == 0)


def _torch_linears(model: nn.Module) -> None:
    """The reference LM's own Linear (F.linear over a (d_out, d_in) weight, no bias) swapped for
    torch's nn.Linear holding the same Parameter, where torchao would convert it (torchao swaps
    nn.Linear only). In place; parameter names and state dict unchanged."""
    from lmperf.model.transformer import Linear

    for name, parent in list(model.named_modules()):
        for child, sub in list(parent.named_children()):
            fqn = f"{name}.{child}" if name else child
            if type(sub) is Linear and convertible(sub, fqn):
                d_out, d_in = sub.weight.shape
                new = nn.Linear(d_in, d_out, bias=False, device="meta")
                new.weight = sub.weight  # the meta weight is dropped, the model's kept
                setattr(parent, child, new)


def _import_torchao():
    """torchao.float8 and its Float8Linear, the import's chatter (missing CUDA extensions of a
    CPU build, printed and logged) kept off the terminal; SpecError in one line when torchao is
    missing."""
    loggers = [logging.getLogger(n) for n in ("torchao", "torch.utils._pytree")]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            import torchao.float8 as f8
            from torchao.float8.float8_linear import Float8Linear
    except ImportError:
        raise SpecError("--float8 needs torchao: pip install 'lmperf[float8]'") from None
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)
    return f8, Float8Linear


def convert_float8(model: nn.Module, recipe: str) -> int:
    """Convert `model`'s Linear layers to torchao's Float8Linear with `recipe` ('tensorwise'
    or 'rowwise'; 'none' leaves the model as it is). Returns how many were converted; raises
    SpecError when torchao is missing or no layer qualifies."""
    if recipe == "none":
        return 0
    f8, float8_linear = _import_torchao()
    _torch_linears(model)
    config = f8.Float8LinearConfig.from_recipe_name(recipe)
    f8.convert_to_float8_training(model, config=config,
                                  module_filter_fn=lambda m, fqn: convertible(m, fqn))
    count = sum(isinstance(m, float8_linear) for m in model.modules())
    if not count:
        raise SpecError(f"--float8 {recipe}: {type(model).__name__} has no Linear layer float8 "
                        "trains (torch.nn.Linear, not the output head, dimensions multiples of "
                        "16)")
    return count
