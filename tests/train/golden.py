"""Golden short loss curves: the configuration, how they are computed, and their tolerances.

Regenerate (after an intended change to the model, the step, the data or the corpus) with
    PYTHONPATH=src:. python -m tests.train.regen_golden
and commit tests/train/data/golden_losses.json with the change that explains it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from lmperf.questions.train.api import train

GOLDEN_PATH = Path(__file__).parent / "data" / "golden_losses.json"
GOLDEN_THREADS = 1  # fp32 sums can split differently with another thread count
GOLDEN_REGIMES: tuple[str, ...] = ("fp32", "bf16-mixed", "bf16-true", "fp16-mixed",
                                   "fp16-mixed-noscale", "fp16-true")
# 20 steps of the tiny preset on 4 x 32-byte windows of the bundled corpus: ~2 s for all six
# regimes on the CPU (fp16 math is emulated there, hence the small batch).
GOLDEN_CONFIG: dict = {"size": "tiny", "context": 32, "batch": 4, "steps": 20, "lr": 3e-3,
                       "lr_warmup": 5, "eval_interval": 10, "eval_batches": 2, "seed": 1234}

# Relative tolerances per regime, and why:
# - fp32: the same machine reproduces it bitwise (test_determinism checks that); 1e-4 leaves room
#   for another CPU's kernels (a different SIMD width sums in a different order).
# - bf16 regimes: bf16 keeps 8 significant bits, so one rounding that falls the other way moves a
#   loss near 5 by ~0.02 (0.4%), and the difference is carried into the next steps: 3%.
# - fp16 regimes: 11 significant bits, 8x finer than bf16: 1%.
TOLERANCE: dict[str, float] = {"fp32": 1e-4, "bf16-mixed": 3e-2, "bf16-true": 3e-2,
                               "fp16-mixed": 1e-2, "fp16-mixed-noscale": 1e-2, "fp16-true": 1e-2}


def compute_curves(regimes: tuple[str, ...] = GOLDEN_REGIMES) -> dict:
    """{regime: {outcome, outcome_step, losses, val_losses}} from a fresh CPU run on one thread,
    in this process, through the Python API (non-finite losses as the strings 'nan' / 'inf',
    as in the records)."""
    c = dict(GOLDEN_CONFIG)
    records = train(c.pop("size"), precision=list(regimes), device="cpu", threads=GOLDEN_THREADS,
                    inline=True, **c).records
    curves = {}
    for record in records:
        m = record["metrics"]
        curves[record["spec"]["precision"]] = {
            "outcome": m["outcome"], "outcome_step": m["outcome_step"],
            "losses": [e["loss"] for e in m["log"]],
            "val_losses": [e["val_loss"] for e in m["evals"]],
        }
    return curves


def write_golden(path: Path = GOLDEN_PATH) -> dict:
    """Compute the curves and write them, with the config and versions, to `path`."""
    doc = {"config": GOLDEN_CONFIG, "torch": torch.__version__, "tolerance": TOLERANCE,
           "curves": compute_curves()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def read_golden(path: Path = GOLDEN_PATH) -> dict:
    """The stored golden curves document."""
    return json.loads(path.read_text())
