"""`lmperf dist --estimate`: the course's accounting questions, checked by hand."""

from __future__ import annotations

import math

import pytest

import lmperf.questions.parallel
from lmperf.cli import main
from lmperf.questions.memory import estimate as memory_estimate
from lmperf.questions.parallel import estimate as est
from lmperf.estimate import formulas as f
from lmperf.runtime.peaks import DEVICES

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
    assert f.activation_bytes(shape, tokens=1) == 126 * (16384 + 53248) * 2
    # FSDP shards all 16 bytes: 3276 GiB / N <= 80 GiB from N = 41 (3276 / 80 = 40.95)
    assert est._fewest(lambda n: est.state_bytes("fsdp", shape.params, n) <= 80 * GIB) == 41
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
    report = lmperf.dist("estimate", size="leaderboard", course="2026", batch=0, world_size=[1, 8],
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
                 "126", "--ffn-only", "--gpus", "64", "--gpu-gib", "80"]) == 0
    out = capsys.readouterr().out
    assert "219,848,638,464" in out and "fsdp" in out


@pytest.mark.parametrize("argv", [["--bandwidth", "0"], ["--d-model", "64"],
                                  ["--d-model", "64", "--d-ff", "256", "--num-layers", "2"],
                                  ["--gpus", "0"]])
def test_estimate_bad_input_is_one_line(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    assert main(["dist", "--estimate", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lmperf: error:") and len(err.strip().splitlines()) == 1


# A small LM by hand: C = 4, F = 8, L = 2, H = 2, V = 10.
TOY = f.Shape("toy", 40 + 2 * (64 + 96 + 8) + 4 + 40, 4, 8, 2, 2, 10)


def test_tensor_parallel_formulas_by_hand() -> None:
    assert TOY.params == 420 and TOY.replicated_params == 2 * 2 * 4 + 4 == 20  # norm weights
    assert f.tp_params(TOY, 2) == 400 / 2 + 20
    # 4 L + 2 = 10 all-reduces of 100 tokens x C x 2 bytes, 2 (t-1)/t = 1 of that each
    assert f.tp_comm_bytes(TOY, 100, 2, 2) == 10 * 1 * 100 * 4 * 2
    # per block and token: 16 C + 8 + 5 a C whole = 112, (5 a C + 4 H + 5 a F) / 2 = 64
    # head: 10 x (8 C + 4 + a C + 4 V / 2) + 4 = 644; copies a (L (4 C^2 + 3 C F) + C V) / 2 = 360
    assert f.activation_bytes(TOY, 10, t=2) == 2 * 10 * (112 + 64) + 644 + 360
    assert f.step_flops(TOY.params, 10) == 6 * 420 * 10


@pytest.mark.parametrize("size, batch, context", [("tiny", 2, 16), ("small", 1, 128)])
def test_unsplit_activations_are_the_memory_estimates(size: str, batch: int, context: int) -> None:
    # t = 1 must be lmperf memory --estimate's saved bytes (bf16 autocast, sdpa, CUDA op lists)
    shape = est.preset_shape(size, "2026", context)
    from lmperf.workload.spec import RunSpec

    config = RunSpec.from_size(size, "2026", context=context).model_config()
    m = memory_estimate.estimate(config, batch, context, "bf16-mixed", "sdpa", "train-step",
                                 device="cuda")
    assert f.activation_bytes(shape, batch * context) == m.activation_bytes + m.weight_copy_bytes


def test_tp_and_2d_rows_by_hand() -> None:
    # leaderboard: P = 8,125,698,048, L = 34, C = 4096; G = 2**20 tokens, W = 100 GB/s, 400 TFLOP/s
    report = lmperf.dist("estimate", size="leaderboard", course="2026", batch=0, world_size=[8], tp=[2, 4])
    df = report.frame
    assert list(df["strategy"]).count("tp") == 1 and list(df["strategy"]).count("fsdp+tp") == 2
    p, rep, tokens = 8_125_698_048, 2 * 34 * 4096 + 4096, 2**20
    tp = df[df["strategy"] == "tp"].iloc[0]
    assert (tp["tp"], tp["dp"]) == (8, 1)
    assert tp["states_gib"] == pytest.approx(16 * ((p - rep) / 8 + rep) / 2**30)
    assert tp["comm_gb"] == pytest.approx(138 * 2 * 7 / 8 * tokens * 4096 * 2 / 1e9)  # 2074 GB
    assert tp["tflop"] == pytest.approx(6 * p * tokens / 8 / 1e12)
    assert tp["comm_bound"]  # 20.7 s of communication against 16.0 s of compute
    # largest t: (4 L + 2) 2 (t-1) C c / W <= 6 P / C_flops  <=>  t <= 1 + 3 P W / (C_f 138 C c)
    assert tp["largest_n_compute_bound"] == math.floor(
        1 + 3 * p * 100e9 / (400e12 * 138 * 4096 * 2)) == 6
    two = df[(df["strategy"] == "fsdp+tp") & (df["tp"] == 2)].iloc[0]
    p_t = (p - rep) / 2 + rep
    assert two["dp"] == 4 and two["states_gib"] == pytest.approx(16 * p_t / 4 / 2**30)
    assert two["comm_gb"] == pytest.approx(
        (3 * 3 / 4 * 2 * p_t + 138 * 2 * 1 / 2 * tokens / 4 * 4096 * 2) / 1e9)
    # largest N = 2 d: d - 1 <= (6 P G W / (t C_f) - 138 (t-1)/t 2 G C c) / (3 c P_t)
    d = 1 + (6 * p * tokens * 100e9 / (2 * 400e12) - 138 * 1 * tokens * 4096 * 2) / (3 * 2 * p_t)
    assert two["largest_n_compute_bound"] == 2 * math.floor(d)
    assert any(s.startswith("fsdp+tp (t = 4)") for s in report.findings)


@pytest.mark.parametrize("gpu, fits", [("H100-SXM", False), ("H200", True), ("B200", True),
                                       ("RTX-4090", False)])
def test_will_it_fit_on_a_gpu(gpu: str, fits: bool) -> None:
    # ddp keeps all 16 P = 121.08 GiB of the leaderboard model's states on every device
    report = lmperf.dist("estimate", size="leaderboard", course="2026", batch=0, world_size=[8], gpu=gpu)
    ddp = report.frame.set_index("strategy").loc["ddp"]
    assert ddp["total_gib"] == pytest.approx(121.08, abs=0.01) and bool(ddp["fits"]) is fits
    spec = DEVICES[gpu]
    # the datasheet's link and bf16 peak are W and C: ddp sends 3.5 P bytes per step at N = 8
    assert ddp["comm_ms"] == pytest.approx(3.5 * 8_125_698_048 / spec.link_bandwidth * 1e3)
    assert ddp["compute_ms"] == pytest.approx(
        6 * 8_125_698_048 * 2**20 / 8 / (spec.peak_tflops("bf16") * 1e12) * 1e3)


def test_gib_and_bandwidth_override_the_gpu() -> None:
    report = lmperf.dist("estimate", size="leaderboard", course="2026", batch=0, world_size=[8],
                         gpu="H200", gpu_gib=100, bandwidth=50)
    ddp = report.frame.set_index("strategy").loc["ddp"]
    assert not ddp["fits"]  # 121 GiB > 100
    assert ddp["comm_ms"] == pytest.approx(3.5 * 8_125_698_048 / 50e9 * 1e3)
    assert "H200" in report.title and "989.4 TFLOP/s" in report.title


def test_batch_adds_activations_split_by_tp(monkeypatch: pytest.MonkeyPatch) -> None:
    from lmperf.estimate import fit

    def missing(*_: object) -> None:
        raise ImportError("the analytic path")

    monkeypatch.setattr(fit, "timelines", missing)
    report = lmperf.dist("estimate", size="xl", course="2026", world_size=[8], tp=[2],
                         batch=2, context=256)
    df = report.frame.set_index(["strategy", "tp"])
    shape = est.preset_shape("xl", "2026", 256)
    assert df.loc[("ddp", 1), "activations_gib"] == pytest.approx(
        f.activation_bytes(shape, 512) / 2**30)
    assert df.loc[("tp", 8), "activations_gib"] < df.loc[("fsdp+tp", 2), "activations_gib"] \
        < df.loc[("fsdp", 1), "activations_gib"]


def test_estimate_cli_prints_tp_rows(capsys: pytest.CaptureFixture) -> None:
    assert main(["dist", "--estimate", "--size", "xl", "--gpus", "8", "--gpu", "h100 sxm",
                 "--tp", "2", "4"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert sum(1 for line in lines if line.split()[:1] == ["fsdp+tp"]) == 2
    assert any(line.split()[:1] == ["tp"] for line in lines) and "H100-SXM" in out


@pytest.mark.parametrize("argv, fragment", [
    (["--gpu", "H800"], "unknown GPU 'H800'; accepted: B200, H200"),
    (["--gpu", "A100"], "ambiguous: A100-80GB"),
    (["--gpu", "A10G"], "A10G has no published dense peak: give --tflops"),
    (["--tp", "0"], "tensor-parallel degree"),
    (["--gib", "-1"], "gpu_gib must be a positive number")])
def test_bad_gpu_options_are_one_line(argv: list[str], fragment: str,
                                      capsys: pytest.CaptureFixture) -> None:
    assert main(["dist", "--estimate", *argv]) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1


def test_node_bandwidth_for_groups_that_span_nodes() -> None:
    # H100-SXM: 450 GB/s NVLink inside a node of 8, 50 GB/s between nodes, C_f = 989.4 TFLOP/s
    report = lmperf.dist("estimate", size="leaderboard", course="2026", batch=0, world_size=[64],
                         tp=[8], gpu="H100-SXM", node_bandwidth=50)
    df = report.frame.set_index("strategy")
    p, tokens, cf = 8_125_698_048, 2**20, 989.4e12
    # ddp's ring over 64 devices crosses nodes: 2 x 63/64 x 2P bytes at 50 GB/s
    assert df.loc["ddp", "comm_ms"] == pytest.approx(2 * 63 / 64 * 2 * p / 50e9 * 1e3)
    # beyond one node: N - 1 <= 3 G W_node / (c C_f) = 79.5
    assert df.loc["ddp", "largest_n_compute_bound"] == math.floor(1 + 3 * tokens * 50e9 / (2 * cf))
    # tp would reach t = 10 on NVLink (1 + 3PW / (138 C c C_f) = 10.8) but stops at the node
    assert df.loc["tp", "largest_n_compute_bound"] == 8
    # fsdp+tp: FSDP's groups (every 8th device) cross nodes, TP's 8 stay on NVLink
    rep = 2 * 34 * 4096 + 4096
    p_t = (p - rep) / 8 + rep
    fsdp, tp = 3 * 7 / 8 * 2 * p_t, 138 * 2 * 7 / 8 * tokens / 8 * 4096 * 2
    assert df.loc["fsdp+tp", "comm_ms"] == pytest.approx((fsdp / 50e9 + tp / 450e9) * 1e3)
    assert df.loc["fsdp+tp", "largest_n_compute_bound"] > df.loc["fsdp", "largest_n_compute_bound"]
    assert "50 GB/s between nodes of 8 devices" in report.title


@pytest.mark.parametrize("argv, fragment", [
    (["train", "--gpu", "H100", "--tp", "2"], "--gpu, --tp: options of --estimate only"),
    (["comm", "--tokens", "5"], "--tokens: an option of --estimate only"),
    (["leaderboard", "--node-bandwidth", "50"], "--node-bandwidth: an option of --estimate only")])
def test_estimate_options_without_estimate_are_refused(argv: list[str], fragment: str,
                                                       capsys: pytest.CaptureFixture) -> None:
    assert main(["dist", *argv]) == 2  # refused before anything runs or is written
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1
