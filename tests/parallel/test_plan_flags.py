"""`dist train` runs what `lmperf plan` chooses (bf16 autocast, checkpointing, gradient
accumulation, ZeRO-2), says what each rank does, names the late rank, and fails loudly."""

from __future__ import annotations

import pytest
import torch

from lmperf.questions.parallel import strategies
from lmperf.questions.parallel.api import dist
from lmperf.cli import main
from lmperf.core.rank import ENV_FAULT
from lmperf.core.torchrun import _hang_message, _laggard


@pytest.mark.slow
def test_plan_flags_train_as_one_process_does_on_the_global_batch(capsys) -> None:
    report = dist(
        "train", world_size=2, size="tiny", vocab_size=256, context=16, batch=2, warmup=1,
        steps=2, profile_steps=1,
        strategy=["torch-ddp", "torch-zero1", "zero1", "fsdp2", "torch-zero2", "flat", "overlap"],
        precision="bf16-mixed", checkpoint="full", grad_accum=2, progress=False)
    assert len(report.records) == 7
    for r in report.records:
        assert r["status"] == "ok", r["message"]
        assert (r["spec"]["precision"], r["spec"]["checkpoint"], r["spec"]["grad_accum"]) == (
            "bf16-mixed", "full", 2)
        check = r["metrics"]["correctness"]
        assert check["equal"] and "global batch 2 x 4" in check["reference"], check
        assert "bf16 autocast" in check["reference"]
        # torch DDP and both ZeRO-1s (no_sync) and flat (after backward) all-reduce once per
        # step, as the plan prices them; FSDP2 and overlap's hooks per micro-batch
        b = r["metrics"]["bytes"]
        assert b["counted_bus_bytes"] == pytest.approx(b["analytic_backend_bus_bytes"], rel=1e-6)
    counted = {r["spec"]["strategy"]: r["metrics"]["bytes"]["counted_bus_bytes"]
               for r in report.records}
    assert counted["zero1"] == pytest.approx(counted["torch-zero1"], rel=1e-6)
    assert "rank 0,1 " in capsys.readouterr().err  # what the ranks were doing, while they ran


def _lm() -> torch.nn.Module:
    from lmperf.model.custom import build_model
    from lmperf.model.presets import ModelConfig

    torch.manual_seed(0)
    return build_model(ModelConfig(vocab_size=64, context_length=8, d_model=16, num_layers=1,
                                   num_heads=2, d_ff=32))


def _setup(model: torch.nn.Module, device: str = "cpu") -> strategies.Setup:
    return strategies.build("single", model, lr=1.0, bucket_mb=25.0, compute_dtype="fp32",
                            device=torch.device(device))


def test_accumulated_micro_batches_make_the_whole_batchs_gradient() -> None:
    """One SGD step moves by the gradient itself (AdamW, as dist's reference check runs it,
    hides a gradient's scale): 2 micro-batches of 2 rows step as the 4 rows at once."""
    from lmperf.questions.parallel.reference import loss_of
    from lmperf.questions.parallel.train import _no_range, train_step
    from lmperf.workload.steps import NO_OBSERVER

    model, whole = _lm(), _lm()
    x, y = torch.randint(0, 64, (4, 8)), torch.randint(0, 64, (4, 8))
    setup = _setup(model)
    setup.optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    train_step(setup, x, y, NO_OBSERVER, _no_range, accum=2)
    loss_of(whole(x), y).backward()
    for p, q in zip(model.parameters(), whole.parameters()):
        torch.testing.assert_close(p.detach(), q.detach() - q.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device, flag", [("cuda", "fused"), ("cpu", "foreach")])
def test_dist_train_steps_the_adamw_the_plan_simulates(device, flag) -> None:
    assert _setup(_lm(), device).optimizer.defaults[flag] is True


def test_a_rank_still_working_is_the_late_one_not_the_ranks_waiting_for_it() -> None:
    # issue 35: rank 0 computed the reference while rank 1 waited at the gather (fewer stage
    # changes): the row blamed rank 1
    states = {0: {"rank": 0, "index": 0, "seq": 12, "waiting": False,
                  "stage": "training the single-process reference"},
              1: {"rank": 1, "index": 0, "seq": 11, "waiting": True,
                  "stage": "gathering the ranks' results"}}
    assert _laggard(states) == 0
    message = _hang_message(type("J", (), {"timeout_s": 300.0}), "fsdp2", states)
    assert "rank 0 hung at 'training the single-process reference' while rank(s) 1 waited" in message
    for s in states.values():  # nobody waits: the fewest stage changes, as before
        s["waiting"] = False
    assert _laggard(states) == 1


def test_dist_exits_non_zero_when_every_run_failed(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(ENV_FAULT, "raise@0@single")
    argv = ["dist", "train", "--world-size", "1", "--strategy", "single", "--size", "tiny",
            "--context", "16", "--batch", "1", "--steps", "1", "--warmup", "0",
            "--profile-steps", "0", "--no-plots", "--out", str(tmp_path / "d.jsonl")]
    assert main(argv) == 1
    monkeypatch.delenv(ENV_FAULT)
    assert main(argv) == 0
