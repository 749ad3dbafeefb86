"""`lmperf dist --estimate`: the course's accounting questions checked by hand; a preset LM is
refused, naming `lmperf plan`."""

from __future__ import annotations

import pytest

import lmperf.questions.parallel
from lmperf.cli import main
from lmperf.errors import SpecError
from lmperf.estimate import formulas as f
from lmperf.questions.parallel import estimate as est
from lmperf.runtime.peaks import DEVICES

GIB = 2**30


def test_xxl_ffn_only_model_states_and_activations() -> None:
    # CS336's XXL accounting model: 126 blocks of two Linear layers 16384 -> 53248 -> 16384
    report = lmperf.dist("estimate", d_model=16384, d_ff=53248, num_layers=126, ffn_only=True,
                         world_size=[64], gib=80)
    df = report.frame.set_index(["strategy", "tp"])
    p = 126 * 2 * 16384 * 53248
    assert (df["params"] == p).all() and p == 219_848_638_464
    # fp32 master weights: 4 bytes each = 819 GiB exactly (16384 x 53248 = 13 x 2**26); with
    # fp32 gradients and AdamW's two moments 16 bytes per parameter: 3276 GiB on ddp
    assert df.loc[("ddp", 1), "states_gib"] == 4 * 819
    # FSDP shards all 16 bytes: 3276 GiB / N <= 80 GiB from N = 41 (3276 / 80 = 40.95)
    assert df.loc[("fsdp", 1), "min_devices"] == 41
    # saved for backward, bf16: each block's input (16384) and first output (53248) per token
    assert f.activation_bytes(f.ffn_only_shape(16384, 53248, 126), tokens=1) == \
        126 * (16384 + 53248) * 2
    # the course's bytes: ddp all-reduces 2P bf16 bytes, 2 (N-1)/N of them sent per device
    assert df.loc[("ddp", 1), "comm_gb"] == pytest.approx(2 * 63 / 64 * 2 * p / 1e9)
    assert df.loc[("fsdp", 1), "comm_gb"] == pytest.approx(3 * 63 / 64 * 2 * p / 1e9)
    assert df.loc[("zero1", 1), "comm_gb"] == pytest.approx((2 * 63 / 64 + 1) * 2 * p / 1e9)


def test_a_preset_is_refused_naming_plan() -> None:
    # a preset's rows were `lmperf plan`'s predictions: plan answers it
    with pytest.raises(SpecError, match="lmperf plan --size X --gpus N"):
        lmperf.dist("estimate", size="xl", world_size=[8])


@pytest.mark.parametrize("gpu, fits", [("H100-SXM", False), ("H200", True), ("B200", True)])
def test_will_it_fit_on_a_gpu(gpu: str, fits: bool) -> None:
    # ddp keeps all 16 P = 120 GiB of states on every device (P = 60 x 2 x 4096 x 16384), and
    # one token's activations per rank: 60 x (4096 + 16384) x 2 bytes
    report = lmperf.dist("estimate", d_model=4096, d_ff=16384, num_layers=60, ffn_only=True,
                         tokens=8, world_size=[8], gpu=gpu, tp=[2])
    ddp = report.frame.set_index("strategy").loc["ddp"]
    assert ddp["total_gib"] == pytest.approx(120.0, abs=0.01) and bool(ddp["fits"]) is fits
    assert gpu in report.title and f"{DEVICES[gpu].memory_gib:g} GiB" in report.title


def test_estimate_cli(capsys: pytest.CaptureFixture) -> None:
    assert main(["dist", "--estimate", "--d-model", "16384", "--d-ff", "53248", "--num-layers",
                 "126", "--ffn-only", "--gpus", "64", "--gib", "80"]) == 0
    out = capsys.readouterr().out
    assert "219,848,638,464" in out and "fsdp" in out


@pytest.mark.parametrize("argv, fragment", [
    (["--bandwidth", "0"], "bandwidth must be a positive number"),
    (["--d-model", "64"], "--ffn-only"),
    (["--d-model", "64", "--d-ff", "256", "--num-layers", "2"], "--ffn-only"),
    (["--gpus", "0"], "--gpus must be a positive integer"),
    (["--gpu", "H800"], "unknown GPU 'H800'; accepted: B200, H200"),
    (["--gpu", "A100"], "ambiguous: A100-80GB"),
    (["--tp", "0"], "--tp must be a positive integer"),
    (["--gib", "-1"], "--gib must be a positive number of GiB"),
    ([], "for a preset LM use `lmperf plan --size X --gpus N`"),
    (["--size", "xl", "--gpus", "8"], "for a preset LM use `lmperf plan --size X --gpus N`"),
    (["--ffn-only", "--d-model", "64", "--d-ff", "256", "--num-layers", "2", "--batch", "2"],
     "dist --estimate prices only the course's accounting model")])
def test_bad_input_is_one_line(argv: list[str], fragment: str,
                               capsys: pytest.CaptureFixture) -> None:
    assert main(["dist", "--estimate", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lmperf: error:") and fragment in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv, fragment", [
    (["train", "--gpu", "H100", "--tokens", "5"], "--tokens, --gpu: options of --estimate only"),
    (["comm", "--tokens", "5"], "--tokens: an option of --estimate only"),
    (["train", "--node-bandwidth", "50"], "--node-bandwidth: an option of --estimate only")])
def test_estimate_options_without_estimate_are_refused(argv: list[str], fragment: str,
                                                       capsys: pytest.CaptureFixture) -> None:
    assert main(["dist", *argv]) == 2  # refused before anything runs or is written
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1


def test_states_by_hand() -> None:
    toy = f.Shape("toy", 420, 4, 8, 2, 2, 10)  # norm weights 2 L C + C = 20
    assert est._states(toy, "ddp", 4, 1) == 16 * 420
    assert est._states(toy, "zero2", 4, 1) == 420 * (4 + 4 / 4 + 8 / 4)
    assert est._states(toy, "fsdp+tp", 4, 2) == 16 * (400 / 2 + 20) / 2
