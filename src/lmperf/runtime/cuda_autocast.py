"""CUDA autocast's fp32 op list, emulated on top of the CPU's autocast for the simulator.

The simulator runs on phantom CPU tensors, so `torch.autocast` applies the CPU's op lists. CUDA's
lists differ in one way that moves memory in lmperf's models: CUDA runs a longer list of ops in
fp32 (exp, sum, softmax, pow, rsqrt, ...: "CUDA Ops that can autocast to float32" in the
torch.amp documentation), casting bf16/fp16 inputs up first. Both lists send matmuls, linear and
scaled_dot_product_attention to the lower precision, and both run the losses in fp32, so the
emulation only adds that cast where CUDA's fp32 list has an op. It works at the torch-function
level: an op reached only inside another op's C++ decomposition is not seen (none of lmperf's
models has one).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

# torch.amp docs, "CUDA Ops that can autocast to float32" (names as torch functions carry them).
CUDA_FP32_OPS: frozenset[str] = frozenset({
    "__pow__", "__rdiv__", "__rpow__", "__rtruediv__", "acos", "asin",
    "binary_cross_entropy_with_logits", "cosh", "cosine_embedding_loss", "cdist",
    "cosine_similarity", "cross_entropy", "cumprod", "cumsum", "dist", "erfinv", "exp", "expm1",
    "group_norm", "hinge_embedding_loss", "kl_div", "l1_loss", "layer_norm", "log",
    "log_softmax", "log10", "log1p", "log2", "margin_ranking_loss", "mse_loss",
    "multilabel_margin_loss", "multi_margin_loss", "nll_loss", "norm", "normalize", "pdist",
    "poisson_nll_loss", "pow", "prod", "reciprocal", "rsqrt", "sinh", "smooth_l1_loss",
    "soft_margin_loss", "softmax", "softmin", "softplus", "sum", "renorm", "tan",
    "triplet_margin_loss"})
_LOW = (torch.bfloat16, torch.float16)


def _up(x: object) -> object:
    return x.float() if isinstance(x, torch.Tensor) and x.dtype in _LOW else x


class _CudaFp32Mode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        if getattr(func, "__name__", None) in CUDA_FP32_OPS and torch.is_autocast_enabled("cpu"):
            args, kwargs = tree_map(_up, (args, kwargs))
        return func(*args, **kwargs)


@contextlib.contextmanager
def cuda_fp32_ops() -> Iterator[None]:
    """While autocast is on, run CUDA's fp32-list ops in fp32, casting bf16/fp16 inputs up.

    Autograd's engine does not carry torch-function modes into backward, where checkpointing
    recomputes blocks: a global module pre-hook re-enters the mode for a module's forward
    when it is not on the stack (that is, during recompute), and the post-hook leaves it.
    """
    from torch.nn.modules.module import (register_module_forward_hook,
                                         register_module_forward_pre_hook)
    from torch.overrides import _get_current_function_mode_stack

    entered: list[_CudaFp32Mode | None] = []

    def pre(*_: object) -> None:
        active = any(isinstance(m, _CudaFp32Mode) for m in _get_current_function_mode_stack())
        mode = None if active else _CudaFp32Mode()
        if mode is not None:
            mode.__enter__()
        entered.append(mode)

    def post(*_: object) -> None:
        mode = entered.pop() if entered else None
        if mode is not None:
            mode.__exit__(None, None, None)

    handles = [register_module_forward_pre_hook(pre), register_module_forward_hook(post)]
    try:
        with _CudaFp32Mode():
            yield
    finally:
        for h in handles:
            h.remove()
