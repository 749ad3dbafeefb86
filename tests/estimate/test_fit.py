"""A rank's simulated peak (lmperf.estimate.fit): what each strategy keeps, THE allowance and THE
verdict."""

from __future__ import annotations

import numpy as np
import pytest

from lmperf.estimate import fit
from lmperf.estimate import formulas as f
from lmperf.estimate.candidate import Candidate
from lmperf.estimate.layout import Layout

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
    base = np.array([[r[cols[c]] if c in cols else 0 for c in simulate.CATEGORIES + simulate.HEAD]
                     for r in rows], dtype=float)
    phase = np.array([r[0] for r in rows])
    return fit.Timelines(base, np.zeros_like(base), phase == "optimizer",
                         np.isin(phase, ("forward", "backward")), 0.0, phase == "backward")


def _candidate(strategy: str, n: int, t: int = 1, b: int = 1, accum: int = 1, **layout):
    name = {"tp": "single", "fsdp+tp": "fsdp"}.get(strategy, strategy)
    lay = Layout(n, tp=t, dp_replicate=n // t if name == "ddp" else 1, **layout)
    return Candidate("bf16-mixed", 0, name, lay, b, accum)


def test_each_strategy_shards_its_categories_and_the_peak_moves() -> None:
    lines = _lines()
    shape = f.Shape("toy", 420, 4, 8, 2, 2, 10)  # largest FSDP unit: a block, 4C² + 3CF + 2C = 168

    def rank(strategy: str, n: int = 4, t: int = 1) -> float:
        peak, allowance = fit.rank_peak(lines, shape, _candidate(strategy, n, t), 10, "cpu")
        assert allowance == 0  # a CPU has no CUDA context
        return peak

    # the optimizer step: 500 bytes, and torch DDP's buckets (the gradients' size) throughout
    assert rank("ddp") == 500 + 100
    # optimizer state 200 / 4 and the step's temporaries 100 / 4: the optimizer step holds
    # 100 + 100 + 50 + 25 = 275, backward 100 + 100 + 50 + 60 = 310, forward 100 + 50 + 150 = 300
    assert rank("zero1") == 310 + 100
    assert rank("zero2") == 100 + 50 + 150  # now forward
    # FSDP2 reduce-scatters the root unit last: backward (the toy's one event makes the head's
    # and the embedding's gradients) holds both unsharded, V C fp32 = 160 each, with the shards'
    # 25 + 25 + 50, the activations 60 and two units gathered: 480 + 1344 > forward 225 + 1344
    assert rank("fsdp") == 25 + 25 + 50 + 60 + 2 * 160 + 2 * 4 * 168
    # tp, t = 2 with sequence parallelism: states x P_t / P = 220 / 420, every token-sized
    # tensor / 2, and the all-gathered matmul inputs kept whole for backward: 2 (b T, C) bf16
    # per block x (1 - 1/t), 2 blocks = 160 at forward's end (where the blocks' activations peak)
    s = 220 / 420
    # optimizer step (400 + 100) s = 261.9 < forward 300 s + 150 / 2 + 160 = 392.1: it moves
    assert rank("tp", 2, 2) == pytest.approx(300 * s + 150 / 2 + 160)
    # FSDP x TP: backward, with the root's gradients unsharded (the head's 1/t, 80; the
    # embedding's whole and its TP shard copied out, 160 x 1.5) and the gathered matmul inputs
    # of the activations held then (160 x 60 / 150), beats forward's 300 s / 2 + 75 + 160
    assert rank("fsdp+tp", 4, 2) == pytest.approx((100 + 100 + 200) * s / 2 + 60 / 2
                                                   + 160 * 60 / 150 + 80 + 240 + 8 * 168 / 2)


def test_accumulation_keeps_the_gradients_through_forward() -> None:
    shape = f.Shape("toy", 420, 4, 8, 2, 2, 10)
    one, _ = fit.rank_peak(_lines(), shape, _candidate("zero2", 4, accum=1), 10, "cpu")
    two, _ = fit.rank_peak(_lines(), shape, _candidate("zero2", 4, accum=2), 10, "cpu")
    assert two - one == 100 / 4  # the rank's share of the gradients, in forward's peak


def test_one_answer_to_fits_a_single_rank_is_memory_estimates_peak():
    """n = 1, no sharding: the plan's per-rank peak is the simulated step's, byte for byte, and
    its allowance the one `memory --estimate` adds."""
    from lmperf.estimate.fit import shape_of

    work = fit.Workload("tiny", "2026", None, 64, "sdpa", "cuda")
    lines = fit.timelines(work, "bf16-mixed", 0)
    for b in (1, 3):
        peak, allowance = fit.rank_peak(lines, shape_of(work), _candidate("single", 1, b=b),
                                        64, "cuda")
        one = fit.device_fit(work.spec(b, "bf16-mixed"), 80)
        # micro-batch 3 is read off the timelines of 1 and 2; CUDA's 512-byte rounding aside
        assert peak == pytest.approx(one["simulated_gib"] * 2**30, rel=1e-4)
        assert (peak + allowance) / 2**30 == pytest.approx(one["peak_gib"], rel=1e-4)


def test_one_allowance_and_one_verdict():
    res = simulate.simulate_step(fit.Workload("tiny", "2026", None, 64, "sdpa", "cuda").spec(
        1, "fp32"))
    # the simulation's allowance is THE allowance, as a rank's peak takes it
    assert res.allowance_bytes == int(simulate.allowance_bytes(res.peak_bytes, "cuda"))
    assert simulate.allowance_bytes(123.0, "cpu") == 0.0
    assert simulate.allowance_bytes(0.0, "cuda") == (512 + 64) * 2**20
    assert fit.fits(10, 10) is True and fit.fits(11, 10) is False and fit.fits(1, None) is None


def test_zero1_owners_get_whole_tensors_the_largest_first_as_torchs_zero() -> None:
    # torch's ZeroRedundancyOptimizer._partition_parameters: sorted by size, largest first,
    # each to the least-loaded rank: 10 -> rank 0, 1 and 1 -> rank 1: rank 0 owns 10 / 12
    shape = f.Shape("toy", 12, 4, 8, 1, numels=(1, 1, 10))
    assert shape.owner_share(2) == 10 / 12
    assert f.Shape("toy", 12, 4, 8, 1).owner_share(4) == 1 / 4  # not counted: an even split
