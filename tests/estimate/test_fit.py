"""A rank's simulated peak (lmperf.estimate.fit) and `dist --estimate`'s memory from it."""

from __future__ import annotations

import numpy as np
import pytest

import lmperf.questions.parallel
from lmperf.estimate import fit
from lmperf.estimate import formulas as f

simulate = pytest.importorskip("lmperf.estimate.simulate")
GIB = 2**30


def _lines():
    """A step's timeline by hand: 4 events (bytes per category), the batch adding nothing."""
    rows = [  # phase, parameters, gradients, optimizer state, activations, temporaries
        ("start", 100, 0, 200, 0, 0),
        ("forward", 100, 0, 200, 150, 0),
        ("backward", 100, 100, 200, 60, 0),
        ("optimizer", 100, 100, 200, 0, 100),
    ]
    cols = {"parameters": 1, "gradients": 2, "optimizer state": 3, "activations": 4,
            "temporaries": 5}
    base = np.array([[r[cols[c]] if c in cols else 0 for c in simulate.CATEGORIES]
                     for r in rows], dtype=float)
    phase = np.array([r[0] for r in rows])
    return fit.Timelines(base, np.zeros_like(base), phase == "optimizer",
                         np.isin(phase, ("forward", "backward")), 0.0)


def test_each_strategy_shards_its_categories_and_the_peak_moves() -> None:
    lines = _lines()
    shape = f.Shape("toy", 420, 4, 8, 2, 2, 10)  # largest FSDP unit: a block, 4C² + 3CF + 2C = 168

    def rank(strategy: str, n: int = 4, t: int = 1, readable: bool = False) -> float:
        peak, allowance = fit.rank_peak(lines, shape, strategy, n, t, 1, 1, "bf16-mixed", "cpu",
                                        10, readable)
        assert allowance == 0  # a CPU has no CUDA context
        return peak

    # the optimizer step: 500 bytes, and torch DDP's buckets (the gradients' size) throughout
    assert rank("ddp") == 500 + 100
    # lmperf's flat DDP instead copies the gradients once backward is over, when only the
    # states are left: 400 + 100, no higher than the optimizer step
    assert rank("ddp", readable=True) == 500
    # optimizer state 200 / 4 and the step's temporaries 100 / 4: the optimizer step holds
    # 100 + 100 + 50 + 25 = 275, backward 100 + 100 + 50 + 60 = 310, forward 100 + 50 + 150 = 300
    assert rank("zero1") == 310 + 100
    assert rank("zero2") == 100 + 50 + 150  # now forward
    assert rank("fsdp") == 25 + 50 + 150 + 2 * 4 * 168
    assert rank("fsdp", readable=True) == 25 + 50 + 150  # its gathered units left out
    # tp, t = 2: states x P_t / P = 220 / 420; activations x saved(t=2) / saved(t=1)
    s, a = 220 / 420, f.saved_activation_bytes(shape, 10, 2) / f.saved_activation_bytes(shape, 10)
    # optimizer step (400 + 100) s = 261.9 < forward 300 s + 150 a = 267.8: the peak moves
    assert rank("tp", 2, 2) == pytest.approx(300 * s + 150 * a)
    assert rank("fsdp+tp", 4, 2) == pytest.approx((100 + 200) * s / 2 + 150 * a + 8 * 168 / 2)


def test_accumulation_keeps_the_gradients_through_forward() -> None:
    shape = f.Shape("toy", 420, 4, 8, 2, 2, 10)
    one, _ = fit.rank_peak(_lines(), shape, "zero2", 4, 1, 1, 1, "bf16-mixed", "cpu", 10)
    two, _ = fit.rank_peak(_lines(), shape, "zero2", 4, 1, 1, 2, "bf16-mixed", "cpu", 10)
    assert two - one == 100 / 4  # the rank's share of the gradients, in forward's peak


@pytest.mark.slow
def test_batch_simulates_the_data_parallel_ranks() -> None:
    # tiny (2026): P = 1,411,392; one simulated bf16-autocast step of 2 x 64 tokens
    report = lmperf.dist("estimate", size="tiny", course="2026", world_size=[8], tp=[2],
                         batch=2, context=64, gpu="H100-SXM")
    df = report.frame.set_index("strategy")
    p = 1_411_392
    assert set(df["memory_method"]) == {"simulated"}
    # fp32 weights and AdamW state are whole at any moment of a ddp step; gradients appear in it
    assert 12 * p <= df.loc["ddp", "states_gib"] * GIB <= 16 * p
    assert df.loc["ddp", "total_gib"] >= df.loc["zero1", "total_gib"] >= df.loc["zero2", "total_gib"]
    assert df.loc["fsdp", "states_gib"] < df.loc["zero2", "states_gib"]
    assert df.loc["tp", "activations_gib"] < df.loc["fsdp+tp", "activations_gib"] \
        < df.loc["fsdp", "activations_gib"]  # t = 8, then t = 2, then whole
    assert (df["allowance_gib"] >= 576 / 1024).all()  # CUDA context + cuBLAS on every row
    assert "simulated" in report.title


def test_without_the_simulator_the_rows_stay_analytic(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(*_: object) -> None:
        raise ImportError("no simulator")

    monkeypatch.setattr(fit, "timelines", missing)
    report = lmperf.dist("estimate", size="tiny", course="2026", world_size=[8], batch=2,
                         context=64)
    assert set(report.frame["memory_method"]) == {"analytic"}
    assert (report.frame["allowance_gib"] == 0).all()
    assert "memory analytic: the step simulator is not installed" in report.title
