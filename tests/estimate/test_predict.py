"""bench --predict: the time model's arithmetic, device names, attention and the host time, and
records labelled as predictions."""

from __future__ import annotations

import pandas as pd
import pytest

from lmperf.errors import SpecError
from lmperf.estimate import time_model
from lmperf.estimate.target import FRACTIONS, HOST_OP_SOURCE
from lmperf.questions.bench import predict as pr
from lmperf.estimate.op_costs import OpCosts
from lmperf.estimate.time_model import Target, queue_ends


def _costs(order: dict | None = None) -> OpCosts:
    table = pd.DataFrame([
        ("forward", "aten::mm", "fp32", "matmul", 1, 2e12, 1e9, 0),
        ("forward", "aten::mul", "fp32", "elementwise/norm", 3, 0, 2e9, 1e9),
        ("optimizer", "aten::_fused_adamw_", "fp32", "optimizer", 1, 0, 4e9, 2e9),
    ], columns=["phase", "op", "dtype", "op_class", "calls", "flops", "bytes_read",
                "bytes_written"])
    return OpCosts(table, "test", 0.0, 0, order or {})


def _gpu(host_s: float = 1e-3, flops: float = 1e12) -> Target:
    return Target("gpu", {"fp32": flops, "tf32": 4 * flops}, flops, FRACTIONS, host_s,
                  "test", False, "test")


def test_ideal_and_typical_per_phase():
    t = time_model.phase_times(_costs(), _gpu())
    f = t["forward"]
    # mm: max(2 s compute, 1 ms memory); mul: 3 GB at 1 TB/s = 3 ms
    assert f.ideal_s == pytest.approx(2.0 + 3e-3)
    assert f.device_s == pytest.approx(2.0 / 0.7 + 3e-3 / 0.8)
    assert (f.flops, f.bytes, f.calls, f.host_s) == (2e12, 4e9, 4, pytest.approx(4e-3))
    # the host issues the mm first (1 ms), the device then runs everything back to back
    assert f.typical_s == pytest.approx(1e-3 + f.device_s)
    # one queue per step: the optimizer's op was issued (at 5 ms) long before the forward's
    # 2.9 s of device work ended, so it runs right after it, no host time showing
    assert t["optimizer"].typical_s == pytest.approx(6e-3 / 0.6)
    assert time_model.phase_times(_costs(), _gpu(), tf32=True)["forward"].ideal_s == pytest.approx(
        0.5 + 3e-3)


def test_a_host_that_runs_ahead_is_charged_where_it_is_slower_not_everywhere():
    # big kernel first: the host issues the small ones while it runs, they hide behind it
    def queue_s(device_s, host_s):  # when the device finishes the last op
        return queue_ends(device_s, host_s)[-1] if device_s else 0.0

    assert list(queue_ends([10.0, 0.1], 1.0)) == pytest.approx([11.0, 11.1])
    assert queue_s([10.0, 0.1, 0.1, 0.1], 1.0) == pytest.approx(1 + 10.3)
    # small kernels first: the device waits for the host, then runs the big one last
    assert queue_s([0.1, 0.1, 0.1, 10.0], 1.0) == pytest.approx(4 + 10.0)
    # every kernel shorter than its issue time: host-bound, the last kernel after the last issue
    assert queue_s([0.1] * 5, 1.0) == pytest.approx(5 + 0.1)
    # the old floor, max(host, device) = 10.3, is the lower bound of both
    assert queue_s([], 1.0) == 0.0


def test_the_issue_order_decides_where_the_host_shows():
    late = _costs({"forward": [1, 1, 1, 0]})  # the three muls, then the mm
    early = _costs({"forward": [0, 1, 1, 1]})
    host = 0.5  # s per op: the muls' issue time hides behind the mm only when the mm is first
    assert time_model.phase_times(early, _gpu(host))["forward"].typical_s == pytest.approx(
        0.5 + 2 / 0.7 + 3 * 3e-3 / 3 / 0.8)
    assert time_model.phase_times(late, _gpu(host))["forward"].typical_s == pytest.approx(
        4 * 0.5 + 2 / 0.7)


def test_a_host_bound_phase_starts_on_the_backlog_the_previous_phase_left():
    table = pd.DataFrame([
        ("forward", "aten::mm", "fp32", "matmul", 1, 7e11, 0, 0),  # 1 s of device work
        ("backward", "aten::mul", "fp32", "elementwise/norm", 4, 0, 0, 0),  # 4 empty kernels
    ], columns=["phase", "op", "dtype", "op_class", "calls", "flops", "bytes_read",
                "bytes_written"])
    t = time_model.phase_times(OpCosts(table, "test", 0.0), _gpu(host_s=0.1))
    # the mm ends at 0.1 + 1 s; the muls were issued by 0.5 s: backward only waits for the queue
    assert t["forward"].typical_s == pytest.approx(1.1)
    assert t["backward"].typical_s == pytest.approx(0.0)
    alone = time_model.phase_times(OpCosts(table[table["phase"] == "backward"], "test", 0.0),
                           _gpu(host_s=0.1))
    assert alone["backward"].typical_s == pytest.approx(0.4)  # host-bound without a backlog


def test_on_a_cpu_host_and_device_time_add():
    cpu = Target("cpu", {"fp32": 1e12}, 1e12, None, 1.0, "test", True, "test")
    f = time_model.phase_times(_costs(), cpu)["forward"]
    assert f.typical_s == pytest.approx(f.ideal_s + 4.0)  # fractions 1, every call's host time


def test_device_names_and_the_host_time_they_are_given():
    assert [t.name for t in pr.gpu_targets("H100")] == ["H100-SXM"]
    a100 = [t.name for t in pr.gpu_targets("A100")]
    assert len(a100) > 1 and all(n.startswith("A100") for n in a100)
    b200 = pr.gpu_targets("B200")[0]
    assert b200.flops_per_s["bf16"] == pytest.approx(2250e12)
    assert b200.host_op_s == pr.HOST_OP_S and b200.host_source == HOST_OP_SOURCE
    given = pr.gpu_targets("B200", 12e-6)[0]
    assert given.host_op_s == 12e-6 and "given" in given.host_source
    with pytest.raises(SpecError, match="unknown GPU"):
        pr.gpu_targets("Z9000")


@pytest.mark.slow
def test_api_predicts_without_running_and_labels_its_records(tmp_path):
    import lmperf

    out = tmp_path / "bench.jsonl"
    report = lmperf.bench(size="tiny", context=32, predict=["H100"], out=out, host_us=7)
    assert report.kind == "prediction"
    (record,) = report.records
    assert record["kind"] == "prediction" and record["prediction"]["predicted"] is True
    assert record["spec"]["device"] == "cuda" and record["spec"]["optimizer"] == "fused"
    assert record["prediction"]["host_op_s"] == pytest.approx(7e-6)
    m = record["metrics"]
    for phase in ("forward", "backward", "optimizer"):
        assert 0 < m[phase]["ideal_s"] <= m[phase]["typical_s"]
        assert m[phase]["host_s"] == pytest.approx(7e-6 * m[phase]["calls"])
    assert m["step"]["ideal_s"] == pytest.approx(sum(m[p]["ideal_s"] for p in
                                                     ("forward", "backward", "optimizer")))
    assert out.read_text().count('"prediction"') >= 1
    text = report.render("text")
    assert "PREDICTED" in text and " .. " in text and "7 us" in text


def test_host_us_is_checked_and_needs_predict():
    import lmperf

    with pytest.raises(SpecError, match="--host-us"):
        lmperf.bench(size="tiny", host_us=5)
    with pytest.raises(SpecError, match="--host-us"):
        pr.predict([], ["H100"], host_us=-1)
    with pytest.raises(SpecError, match="--host-us"):
        pr.predict([], ["H100"], host_us=True)
    with pytest.raises(SpecError, match="this CPU's is measured"):
        pr.predict([], ["cpu"], host_us=5)
    assert "given" in pr.gpu_targets("H100", pr.HOST_OP_S, "given (--host-us)")[0].host_source


@pytest.mark.slow
def test_sdpa_counts_the_attention_flops_naive_does_and_shows_the_attention():
    specs = pr.plan_predictions(["H100"], size="tiny", context=256, mode="forward-backward",
                                attention=["naive", "sdpa"], precision=["fp32", "bf16-mixed"])
    records = pr.predict(specs, ["H100"])
    flops = {(r["spec"]["attention"], r["spec"]["precision"]):
             (r["metrics"]["forward"]["flops"], r["metrics"]["backward"]["flops"])
             for r in records}
    for precision in ("fp32", "bf16-mixed"):
        assert flops[("sdpa", precision)] == flops[("naive", precision)]
    frame, *_ = pr.build_report(records).display(pr.build_report(records))
    assert sorted(frame["attention"]) == ["naive", "naive", "sdpa", "sdpa"]


def test_an_unwritable_out_is_refused_before_anything_is_counted(tmp_path, monkeypatch):
    import lmperf
    from lmperf.errors import ResultsFileError

    def never(*args, **kwargs):
        raise AssertionError("predicted before checking --out")

    monkeypatch.setattr(pr, "predict", never)
    (tmp_path / "file").write_text("")
    with pytest.raises(ResultsFileError, match="cannot write results"):
        lmperf.bench(size="tiny", predict=["H100"], out=tmp_path / "file" / "x.jsonl")


def _prediction(spec: dict, target: str) -> dict:
    return {"kind": "prediction", "spec": spec, "prediction": {"target": target},
            "metrics": {p: {"typical_s": s} for p, s in (("forward", 0.012), ("backward", 0.02),
                                                         ("optimizer", 0.003))}}


def test_prediction_errors_pair_phases_with_the_measured_run_on_that_device():
    spec = {"size": "tiny", "model": None, "context": 128, "batch": 4, "precision": "fp32",
            "attention": "naive", "mode": "train-step", "device": "cpu"}
    predicted = _prediction(spec, "this CPU (x, 1 thread(s), measured)")
    measured = {"kind": "bench", "status": "ok", "spec": spec, "env": {"device_name": "x"},
                "metrics": {
        "forward_ms": {"median": 10.0}, "backward_ms": {"median": 25.0},
        "optimizer_ms": {"median": 3.0},
        "cpu_time": {"forward_ms": {"median": 8.0}, "backward_ms": {"median": 20.0},
                     "optimizer_ms": {"median": 2.0}}}}
    other = {**measured, "spec": {**spec, "context": 256}}
    sdpa = {**measured, "spec": {**spec, "attention": "sdpa"}}  # another attention: no pair
    df = pr.prediction_errors([predicted], [measured, other, sdpa])
    assert list(df["phase"]) == ["forward", "backward", "optimizer"]
    assert list(df["error_wall"].round(6)) == [0.2, -0.2, 0.0]
    assert list(df["error_cpu"].round(6)) == [0.5, 0.0, 0.5]
    pooled = {**measured, "metrics": {**measured["metrics"], "cpu_time": {
        **measured["metrics"]["cpu_time"], "clock": "process_time"}}}  # --threads 2: summed
    df = pr.prediction_errors([predicted], [pooled])
    assert df["cpu_ms"].isna().all() and df["error_cpu"].isna().all()
    # a GPU prediction pairs with a run on that GPU only, not with the CPU run
    h100 = _prediction({**spec, "device": "cuda"}, "H100-SXM")
    on_h100 = {**measured, "spec": {**spec, "device": "cuda"},
               "env": {"device_name": "NVIDIA H100 80GB HBM3"}}
    on_a100 = {**on_h100, "env": {"device_name": "NVIDIA A100-SXM4-80GB"}}
    df = pr.prediction_errors([predicted, h100], [measured, on_h100, on_a100])
    assert sorted(set(zip(df["device"], df["measured_ms"]))) == sorted(
        {("H100-SXM", 10.0), ("H100-SXM", 25.0), ("H100-SXM", 3.0),
         (predicted["prediction"]["target"], 10.0), (predicted["prediction"]["target"], 25.0),
         (predicted["prediction"]["target"], 3.0)})


@pytest.mark.slow
def test_cpu_prediction_uses_the_ceilings_measured_now(tmp_path):
    import lmperf

    report = lmperf.bench(size="tiny", context=32, precision="fp32", predict=["cpu"],
                          out=tmp_path / "b.jsonl")
    (record,) = report.records
    p = record["prediction"]
    assert {"fp32", "bf16", "fp16"} <= set(p["flops_per_s"])  # measured, not fp32's reused
    assert p["caveats"] == [] and "measured now" in p["host_op_source"]
    for phase in ("forward", "backward", "optimizer"):
        m = record["metrics"][phase]
        assert 0 < m["ideal_s"] < m["typical_s"] == pytest.approx(m["device_s"] + m["host_s"])


def test_a_user_model_fake_tensors_cannot_run_is_one_line_before_the_cpu_is_measured(
        monkeypatch):
    from lmperf.workload.spec import RunSpec

    def measure(threads=None):
        raise AssertionError("measured before counting")

    monkeypatch.setattr(pr, "cpu_target", measure)
    spec = RunSpec.from_size("tiny", context=8, batch=1,
                             model="tests.fixtures.models:data_dependent")  # .item()
    with pytest.raises(SpecError) as e:
        pr.predict([spec], ["cpu"])
    assert "data_dependent" in str(e.value) and "\n" not in str(e.value)


def test_a_cpu_bf16_prediction_carries_its_caveat(monkeypatch):
    from lmperf.workload.spec import RunSpec

    cpu = Target("cpu", {"fp32": 1e11, "bf16": 1e9}, 1e10, None, 1e-5, "measured now", True,
                 "test", caveats={"bf16": "bf16 on this CPU: one square product's rate"})
    monkeypatch.setattr(pr, "cpu_target", lambda threads=None: cpu)
    specs = [RunSpec.from_size("tiny", context=8, batch=1, mode="forward", num_layers=1,
                               precision=p) for p in ("fp32", "bf16-mixed")]
    fp32, bf16 = pr.predict(specs, ["cpu"])
    assert fp32["prediction"]["caveats"] == [] and bf16["prediction"]["caveats"] == [
        "bf16 on this CPU: one square product's rate"]
    assert "bf16 on this CPU: one square product's rate" in pr.build_report([fp32, bf16]).findings


@pytest.mark.slow
def test_flash_triton_is_predicted_as_the_one_fused_kernel_sdpa_is():
    specs = pr.plan_predictions(["H100"], size="tiny", context=64, mode="forward",
                                attention=["flash-triton", "sdpa"])
    triton, sdpa = pr.predict(specs, ["H100"])
    assert triton["spec"]["attention"] == "flash-triton"
    assert triton["metrics"]["forward"] == sdpa["metrics"]["forward"]


def test_predictions_written_before_the_time_model_still_render():
    from pathlib import Path

    from lmperf.results.store import read_records

    path = Path(__file__).resolve().parents[1] / "fixtures/records/prediction-before-issue26.jsonl"
    (record,) = read_records(path)  # schema 1, written by 36465cc
    assert record["schema"] == 3 and record["metrics"]["step"]["host_s"] is None
    report = pr.build_report([record])
    assert list(report.frame["bound"]) == ["-"] and "PREDICTED" in report.render("text")


def test_a_model_factory_gets_the_one_shape_every_command_hands_it():
    from lmperf.core.vocabulary import MODEL_SIZE

    for devices in (["H100"], ["cpu"]):
        (spec,) = pr.plan_predictions(devices, model="tests.fixtures.models:bigram", context=32,
                                      precision="fp32")
        assert spec.size == MODEL_SIZE
