"""The annotation layer: one context manager that opens a torch.profiler `record_function` range
and, where CUDA's NVTX is usable, an NVTX range of the same name (what Nsight Systems sees).

The model stays free of profiling code: `annotate_attention(model)` swaps each layer's naive
attention for a subclass that puts a range around each of its three steps.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch.nn as nn
from torch.autograd.profiler import record_function

from lmperf.kernels.naive import NaiveAttention
from lmperf.runtime import device as dev

# Range names (re-exported), shared with the trace analysis.
from lmperf.questions.profile.range_names import (  # noqa: F401
    ATTENTION_RANGES, FINAL_MATMUL, SCORES, SOFTMAX, WARMUP)


@contextlib.contextmanager
def annotate(name: str) -> Iterator[None]:
    """A `record_function` range named `name`, plus an NVTX range where NVTX works."""
    with dev.nvtx_range(name), record_function(name):
        yield


class AnnotatedNaiveAttention(NaiveAttention):
    """The naive attention with a range around scores, softmax and the final matmul."""

    def scores(self, q, k, mask):
        with annotate(SCORES):
            return super().scores(q, k, mask)

    def softmax(self, scores):
        with annotate(SOFTMAX):
            return super().softmax(scores)

    def combine(self, probs, v):
        with annotate(FINAL_MATMUL):
            return super().combine(probs, v)


def annotate_attention(model: nn.Module) -> int:
    """Replace every naive attention in `model` with the annotated one; return how many.

    Looks for modules with an `attention` attribute holding a NaiveAttention (the reference
    LM's layout); other models are left as they are and get phase ranges only.
    """
    count = 0
    for module in model.modules():
        if isinstance(getattr(module, "attention", None), NaiveAttention):
            module.attention = AnnotatedNaiveAttention()
            count += 1
    return count
