"""`lmperf dist --estimate`: the course's accounting questions checked by hand, and every row of a
preset the plan's prediction of that configuration."""

from __future__ import annotations

import pytest

import lmperf.questions.parallel
from lmperf.cli import main
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


@pytest.fixture(scope="module")
def tiny_rows():
    return lmperf.dist("estimate", size="tiny", course="2026", world_size=[8], tp=[2],
                       batch=2, context=64, tokens=16 * 64, gpu="H100-SXM")


def test_every_row_is_the_plans_prediction_of_that_configuration(tiny_rows) -> None:
    """dist --estimate and plan: the same peak and step time for the same configuration."""
    from lmperf.estimate.fit import Workload
    from lmperf.estimate.fit import shape_of
    from lmperf.estimate.plan import Space, candidates
    from lmperf.estimate.target import cluster

    work = Workload("tiny", "2026", None, 64, "sdpa", "cuda")
    rows, _ = candidates(work, shape_of(work), cluster("H100-SXM", 8), 16,
                         Space(("bf16-mixed",), (0,), pp=(1,), cp=(1,), async_tp=(False,),
                               compile=(False,), float8=("none",)))
    df = tiny_rows.frame.set_index(["strategy", "tp"])
    compared = 0
    for r in rows:
        name = {"fsdp": "fsdp+tp", "single": "tp"}[r["strategy"]] if r["tp"] > 1 else r["strategy"]
        if r["micro_batch"] != 2 or (name, r["tp"]) not in df.index or r["dp_replicate"] > 1 \
                and r["strategy"] != "ddp":
            continue
        row = df.loc[(name, r["tp"])]
        assert row["total_gib"] == pytest.approx(r["peak_gib"], rel=1e-9)
        assert row["step_ms"] / 1e3 == pytest.approx(r["step_s"], rel=1e-9)
        compared += 1
    assert compared >= 5  # ddp, zero1, zero2, fsdp, fsdp+tp (t = 2)


def test_the_memory_is_the_simulated_rank(tiny_rows) -> None:
    # tiny (2026): P = 1,411,392; one simulated bf16-autocast step of 2 x 64 tokens
    df = tiny_rows.frame.set_index("strategy")
    p = 1_411_392
    assert set(df["memory_method"]) == {"simulated"}
    assert df.loc["ddp", "states_gib"] * GIB == 16 * p  # fp32 weights, gradients, AdamW
    assert df.loc["ddp", "total_gib"] >= df.loc["zero1", "total_gib"] >= df.loc["zero2", "total_gib"]
    assert df.loc["fsdp+tp", "activations_gib"] < df.loc["fsdp", "activations_gib"]
    assert (df["allowance_gib"] >= 576 / 1024).all()  # CUDA context + cuBLAS on every row
    assert "simulated" in tiny_rows.title and "H100-SXM" in tiny_rows.title


def test_model_states_only_with_batch_0() -> None:
    report = lmperf.dist("estimate", size="leaderboard", course="2026", batch=0, world_size=[8],
                         gib=80, tp=[2])
    df = report.frame.set_index(["strategy", "tp"])
    p = 8_125_698_048  # V C + L (4 C^2 + 3 C F + 2 C) + C + C V, V=151936 C=4096 F=11008 L=34
    assert (df["params"] == p).all()
    assert df.loc[("ddp", 1), "total_gib"] == pytest.approx(16 * p / GIB)  # 121.08 GiB
    assert not df.loc[("ddp", 1), "fits"] and df.loc[("zero1", 1), "fits"]
    assert df.loc[("zero1", 1), "states_gib"] == pytest.approx((8 * p + p) / GIB)  # 68.11
    rep = 2 * 34 * 4096 + 4096  # norm weights stay whole under TP
    assert df.loc[("fsdp+tp", 2), "states_gib"] == pytest.approx(16 * ((p - rep) / 2 + rep) / 4 / GIB)
    # the course's bytes at N = 8 in bf16, once per step: ddp 2 x 7/8 x 2 P, zero1 2 P more
    assert df.loc[("ddp", 1), "comm_gb"] == pytest.approx(3.5 * p / 1e9)
    assert df.loc[("zero1", 1), "comm_gb"] == pytest.approx((3.5 + 2) * p / 1e9)  # + broadcast
    assert report.records == [] and any(s.startswith("zero2") for s in report.findings)


@pytest.mark.parametrize("gpu, fits", [("H100-SXM", False), ("H200", True), ("B200", True)])
def test_will_it_fit_on_a_gpu(gpu: str, fits: bool) -> None:
    # ddp keeps all 16 P = 121.08 GiB of the leaderboard model's states on every device
    report = lmperf.dist("estimate", size="leaderboard", course="2026", batch=0, world_size=[8],
                         gpu=gpu, tp=[2])
    ddp = report.frame.set_index("strategy").loc["ddp"]
    assert ddp["total_gib"] == pytest.approx(121.08, abs=0.01) and bool(ddp["fits"]) is fits
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
    (["--gib", "-1"], "--gib must be a positive number of GiB")])
def test_bad_input_is_one_line(argv: list[str], fragment: str,
                               capsys: pytest.CaptureFixture) -> None:
    assert main(["dist", "--estimate", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lmperf: error:") and fragment in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv, fragment", [
    (["train", "--gpu", "H100", "--tokens", "5"], "--tokens, --gpu: options of --estimate only"),
    (["comm", "--tokens", "5"], "--tokens: an option of --estimate only"),
    (["leaderboard", "--node-bandwidth", "50"], "--node-bandwidth: an option of --estimate only")])
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
