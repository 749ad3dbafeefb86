"""`lmperf dist --estimate`: the course's accounting questions, checked by hand."""

from __future__ import annotations

import math

import pytest

import lmperf.questions.parallel
from lmperf.cli import main
from lmperf.questions.parallel import estimate as est

GIB = 2**30


def test_xxl_ffn_only_model_states_and_activations() -> None:
    # CS336's XXL accounting model: 126 blocks of two Linear layers 16384 -> 53248 -> 16384
    shape = est.ffn_only_shape(16384, 53248, 126)
    assert shape.params == 126 * 2 * 16384 * 53248 == 219_848_638_464
    # fp32 master weights: 4 bytes each = 819 GiB exactly (16384 x 53248 = 13 x 2**26)
    assert 4 * shape.params / GIB == 819
    # + fp32 accumulated gradients + AdamW's two fp32 moments: 16 bytes per parameter
    assert est.state_bytes("ddp", shape.params, 1) / GIB == 4 * 819 == 3276
    # saved for backward, bf16: each block's input (16384) and first output (53248) per token
    assert est.saved_activation_bytes(shape, tokens=1) == 126 * (16384 + 53248) * 2
    # FSDP shards all 16 bytes: 3276 GiB / N <= 80 GiB from N = 41 (3276 / 80 = 40.95)
    assert est._min_devices("fsdp", shape.params, 80) == 41
    assert est.state_bytes("fsdp", shape.params, 41) / GIB == pytest.approx(3276 / 41)


def test_memory_and_volume_per_strategy() -> None:
    p, n = 1_000_000, 8
    assert est.state_bytes("zero1", p, n) == 8 * p + 8 * p / n
    assert est.state_bytes("zero2", p, n) == 4 * p + 12 * p / n
    s = 2 * p  # bf16 messages
    assert est.comm_bytes("ddp", p, n, 2) == pytest.approx(2 * 7 / 8 * s)
    assert est.comm_bytes("fsdp", p, n, 2) == pytest.approx(3 * 7 / 8 * s)  # 1.5x ddp
    assert est.comm_bytes("zero1-ar-bcast", p, n, 2) == pytest.approx(2 * 7 / 8 * s + s)
    assert est.comm_bytes("ddp", p, 1, 2) == 0


def test_largest_n_before_communication_bound_closed_form() -> None:
    # ddp: 2 (N-1)/N x 2P / W <= 6 P B / (N C)  <=>  N <= 1 + 1.5 B W / C
    p, tokens, w, c = 8_125_698_048, 2**20, 100.0, 400.0
    bound = 1 + 1.5 * tokens * w * 1e9 / (c * 1e12)
    assert est.largest_n("ddp", p, tokens, w, c, 2) == math.floor(bound) == 394
    # fsdp moves 3 (N-1)/N: N <= 1 + B W / C
    assert est.largest_n("fsdp", p, tokens, w, c, 2) == math.floor(1 + tokens * w * 1e9 / (c * 1e12))
    assert est.largest_n("ddp", p, 1, w, c, 2) is None  # one token per step: comm-bound at N=2


def test_leaderboard_preset_report() -> None:
    report = lmperf.dist("estimate", size="leaderboard", course="2026", world_size=[1, 8],
                         gpu_gib=80)
    df = report.frame.set_index(["strategy", "world_size"])
    p = 8_125_698_048  # V C + L (4 C^2 + 3 C F + 2 C) + C + C V, V=151936 C=4096 F=11008 L=34
    assert (df["params"] == p).all()
    assert df.loc[("ddp", 1), "total_gib"] == pytest.approx(16 * p / GIB)  # 121.08 GiB
    assert not df.loc[("ddp", 8), "fits"] and df.loc[("zero1", 8), "fits"]
    assert df.loc[("zero1", 8), "states_gib"] == pytest.approx((8 * p + p) / GIB)  # 68.11
    assert df.loc[("fsdp", 8), "comm_ms"] == pytest.approx(3 * 7 / 8 * 2 * p / 100e9 * 1e3)
    assert report.records == [] and any("zero2" in f for f in report.findings)


def test_estimate_cli(capsys: pytest.CaptureFixture) -> None:
    assert main(["dist", "--estimate", "--d-model", "16384", "--d-ff", "53248", "--num-layers",
                 "126", "--ffn-only", "--world-size", "64", "--gpu-gib", "80"]) == 0
    out = capsys.readouterr().out
    assert "219,848,638,464" in out and "fsdp" in out


@pytest.mark.parametrize("argv", [["--bandwidth", "0"], ["--d-model", "64"],
                                  ["--d-model", "64", "--d-ff", "256", "--num-layers", "2"],
                                  ["--world-size", "0"]])
def test_estimate_bad_input_is_one_line(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    assert main(["dist", "--estimate", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lmperf: error:") and len(err.strip().splitlines()) == 1
