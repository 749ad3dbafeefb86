"""The names of lmperf's record_function ranges, shared by the annotation layer (which needs
torch) and the trace analysis (which must not import torch: a trace is analysed on any machine,
and importing torch costs seconds and ~250 MB of memory)."""

from __future__ import annotations

WARMUP, STEP, FORWARD, LOSS, BACKWARD, OPTIMIZER = "warmup", "step", "forward", "loss", "backward", "optimizer"
SCORES, SOFTMAX, FINAL_MATMUL = "computing attention scores", "computing softmax", "final matmul"
ATTENTION_RANGES: tuple[str, ...] = (SCORES, SOFTMAX, FINAL_MATMUL)
