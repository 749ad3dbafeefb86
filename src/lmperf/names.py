"""The names the command line accepts, without importing torch: precision regimes and attention
implementations (their registries, which need torch, are checked against these in the tests),
so that `lmperf --help` and a bad name answer in a fraction of a second.

This module imports nothing of lmperf's.
"""

from __future__ import annotations

# The keys of lmperf.runtime.precision.REGIMES, in its order.
REGIME_NAMES: tuple[str, ...] = ("fp32", "tf32", "bf16-mixed", "fp16-mixed", "fp16-mixed-noscale",
                                 "bf16-true", "fp16-true")

# The keys of lmperf.kernels.IMPLEMENTATIONS, in its order.
ATTENTION_NAMES: tuple[str, ...] = ("naive", "sdpa", "compiled", "flash-torch", "flash-triton")

# What a benchmark step runs, and the AdamW implementations (lmperf.workload.spec).
MODES: tuple[str, ...] = ("forward", "forward-backward", "train-step")
OPTIMIZERS: tuple[str, ...] = ("fused", "foreach", "loop")
# The one AdamW a plan and the commands it writes run per device (dist train, --confirm, bench).
ADAMW_ON: dict[str, str] = {"cpu": "foreach", "cuda": "fused"}

# torch.compile's modes (`torch.compile(mode=...)`): --compile-mode's choices.
COMPILE_MODES: tuple[str, ...] = ("default", "reduce-overhead", "max-autotune",
                                  "max-autotune-no-cudagraphs")

# torch.distributed.pipelining's schedules lmperf prices and runs (torch's class names without
# "Schedule"; `get_schedule_class` reads them in any case).
PP_SCHEDULES: tuple[str, ...] = ("GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble",
                                 "ZBVZeroBubble")

# Where a job runs (already resolved from 'auto').
DEVICES: tuple[str, ...] = ("cpu", "cuda")

# torchao's float8 training recipes (Float8LinearConfig.from_recipe_name), and none.
FLOAT8_RECIPES: tuple[str, ...] = ("none", "tensorwise", "rowwise")
