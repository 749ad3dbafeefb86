"""lmperf's FSDP through the course's 2026 FSDP correctness test, in that test's style: 2 gloo
ranks (mp.spawn), the course's adapter functions, a toy model of the course's Linear /
Embedding / RMSNorm, SGD, 20 sequences split over the ranks, the last position's logits.

In fp32 the test demands `torch.equal` with single-process training after every step (the
course's own test allows 1e-6; `get_fsdp` is exact in fp32). Without `exact` the sharded
weights differ by one ulp (1.5e-8) after the first step: see questions/parallel/fsdp.py.
"""

from __future__ import annotations

from copy import deepcopy
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

from lmperf.model.transformer import Embedding, Linear, RMSNorm
from lmperf.questions.parallel.fsdp import fsdp_gather_full_params, fsdp_on_after_backward, get_fsdp

WORLD = 2


class ToyFSDPModel(nn.Module):
    """ids (B, T) -> logits (B, T, vocab): the course's toy model, with lmperf's layers."""

    def __init__(self, vocab_size: int = 100, d_model: int = 64, d_ff: int = 128):
        super().__init__()
        self.embedding = Embedding(vocab_size, d_model)
        self.norm1 = RMSNorm(d_model)
        self.linear1 = Linear(d_model, d_ff)
        self.norm2 = RMSNorm(d_ff)
        self.linear2 = Linear(d_ff, d_model)
        self.lm_head = Linear(d_model, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.linear1(self.norm1(self.embedding(x))))
        return self.lm_head(self.linear2(self.norm2(x)))


def _correctness(rank: int, store: str, out: str) -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        torch.manual_seed(42)
        base = ToyFSDPModel()
        single = deepcopy(base)
        fsdp = get_fsdp(deepcopy(base), compute_dtype=None)
        loss_fn = nn.CrossEntropyLoss()
        fsdp_opt = torch.optim.SGD(fsdp.parameters(), lr=0.01)
        single_opt = torch.optim.SGD(single.parameters(), lr=0.01)
        torch.manual_seed(123)
        batch, local = 20, 20 // WORLD
        ids = torch.randint(0, 100, (batch, 8))
        labels = torch.randint(0, 100, (batch,))
        diffs = []
        for step in range(3):
            fsdp_opt.zero_grad(set_to_none=True)
            single_opt.zero_grad(set_to_none=True)
            loss_fn(single(ids)[:, -1, :].float(), labels).backward()
            single_opt.step()
            mine = slice(rank * local, (rank + 1) * local)
            loss_fn(fsdp(ids[mine])[:, -1, :].float(), labels[mine]).backward()
            fsdp_on_after_backward(fsdp, fsdp_opt)
            for p in fsdp.parameters():  # the course's check: gradients typed as the fp32 params
                assert p.grad is not None and p.grad.dtype == p.dtype == torch.float32
            fsdp_opt.step()
            full = fsdp_gather_full_params(fsdp)
            diffs.append({name: (p.detach() - full[name]).abs().max().item()
                          if not torch.equal(p.detach(), full[name]) else 0.0
                          for name, p in single.named_parameters()})
            torch.manual_seed(42 + step)
            perm = torch.randperm(batch)
            ids, labels = ids[perm], labels[perm]
        if rank == 0:
            torch.save(diffs, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_fp32_fsdp_is_bitwise_equal_to_single_process(tmp_path: Path) -> None:
    out = tmp_path / "diffs.pt"
    mp.spawn(_correctness, args=(str(tmp_path / "store"), str(out)), nprocs=WORLD, join=True)
    diffs = torch.load(out)
    assert len(diffs) == 3 and len(diffs[0]) == 6
    for step, per_param in enumerate(diffs):
        unequal = {name: d for name, d in per_param.items() if d != 0.0}
        assert not unequal, f"step {step}: not bitwise equal: {unequal}"
