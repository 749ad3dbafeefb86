"""The note of a simulated CUDA mixed-precision step says why CPU autocast lists were used, truly
for this torch: a CUDA build has a CUDA backend (issue 26 L5)."""

from __future__ import annotations

import pytest
import torch

from lmperf.estimate.simulate import simulate_step
from lmperf.workload.spec import RunSpec


@pytest.mark.parametrize("built, why", [(True, "the phantom tensors are CPU tensors"),
                                        (False, "this torch has no CUDA backend")])
def test_the_cuda_autocast_note_is_true_for_this_build(monkeypatch, built, why):
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: built)
    spec = RunSpec.from_size("tiny", context=32, batch=2, precision="bf16-mixed", mode="forward",
                             device="cuda")
    (note,) = [n for n in simulate_step(spec).notes if "autocast" in n]
    assert note.endswith(why) and ("no CUDA backend" in note) is not built
