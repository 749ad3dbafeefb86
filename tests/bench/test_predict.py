"""bench --predict: the prediction arithmetic, device names, and records labelled as predictions."""

from __future__ import annotations

import pandas as pd
import pytest

from lmperf.errors import SpecError
from lmperf.questions.bench import predict as pr


def _costs() -> pd.DataFrame:
    return pd.DataFrame([
        ("forward", "aten::mm", "fp32", "matmul", 1, 2e12, 1e9, 0),
        ("forward", "aten::mul", "fp32", "elementwise/norm", 3, 0, 2e9, 1e9),
        ("optimizer", "aten::_fused_adamw_", "fp32", "optimizer", 1, 0, 4e9, 2e9),
    ], columns=["phase", "op", "dtype", "op_class", "calls", "flops", "bytes_read",
                "bytes_written"])


GPU = pr.Target("gpu", {"fp32": 1e12, "tf32": 4e12}, 1e12, pr.FRACTIONS, 1e-3, False, "test")


def test_ideal_and_typical_per_phase():
    t = pr.phase_times(_costs(), GPU)
    ideal, typical, flops, nbytes, calls = t["forward"]
    # mm: max(2 s compute, 1 ms memory); mul: 3 GB at 1 TB/s = 3 ms
    assert ideal == pytest.approx(2.0 + 3e-3)
    assert typical == pytest.approx(2.0 / 0.7 + 3e-3 / 0.5)
    assert (flops, nbytes, calls) == (2e12, 4e9, 4)
    assert t["optimizer"][1] == pytest.approx(6e-3 / 0.6)
    assert pr.phase_times(_costs(), GPU, tf32=True)["forward"][0] == pytest.approx(0.5 + 3e-3)


def test_host_time_floors_the_gpu_and_adds_on_the_cpu():
    slow_host = pr.Target("gpu", {"fp32": 1e15}, 1e15, pr.FRACTIONS, 1.0, False, "test")
    assert pr.phase_times(_costs(), slow_host)["forward"][1] == pytest.approx(4.0)  # 4 calls x 1 s
    cpu = pr.Target("cpu", {"fp32": 1e12}, 1e12, None, 1.0, True, "test")
    ideal, typical = pr.phase_times(_costs(), cpu)["forward"][:2]
    assert typical == pytest.approx(ideal + 4.0)  # fractions 1, calls added


def test_device_names():
    assert [t.name for t in pr.gpu_targets("H100")] == ["H100-SXM"]
    a100 = [t.name for t in pr.gpu_targets("A100")]
    assert len(a100) > 1 and all(n.startswith("A100") for n in a100)
    assert pr.gpu_targets("B200")[0].flops_per_s["bf16"] == pytest.approx(2250e12)
    with pytest.raises(SpecError, match="unknown GPU"):
        pr.gpu_targets("Z9000")


@pytest.mark.slow
def test_api_predicts_without_running_and_labels_its_records(tmp_path):
    import lmperf

    out = tmp_path / "bench.jsonl"
    report = lmperf.bench(size="tiny", context=32, predict=["H100"], out=out)
    assert report.kind == "prediction"
    (record,) = report.records
    assert record["kind"] == "prediction" and record["prediction"]["predicted"] is True
    assert record["spec"]["device"] == "cuda" and record["spec"]["optimizer"] == "fused"
    m = record["metrics"]
    for phase in ("forward", "backward", "optimizer"):
        assert 0 < m[phase]["ideal_s"] <= m[phase]["typical_s"]
    assert m["step"]["ideal_s"] == pytest.approx(sum(m[p]["ideal_s"] for p in
                                                     ("forward", "backward", "optimizer")))
    assert out.read_text().count('"prediction"') >= 1
    text = report.render("text")
    assert "PREDICTED" in text and " .. " in text


def test_an_unwritable_out_is_refused_before_anything_is_counted(tmp_path, monkeypatch):
    import lmperf
    from lmperf.errors import ResultsFileError

    def never(*args, **kwargs):
        raise AssertionError("predicted before checking --out")

    monkeypatch.setattr(pr, "predict", never)
    (tmp_path / "file").write_text("")
    with pytest.raises(ResultsFileError, match="cannot write results"):
        lmperf.bench(size="tiny", predict=["H100"], out=tmp_path / "file" / "x.jsonl")


def _sized_costs() -> pd.DataFrame:
    """Rows as `OpCosts.table` has them since the size-aware CPU model: (m, k, n), elements."""
    return pd.DataFrame([
        # phase, op, dtype, class, m, k, n, calls, FLOPs, read, written, elements
        ("forward", "aten::mm", "fp32", "matmul", 1024, 1024, 1024, 1, 2 * 1024**3, 8e6, 4e6, 0),
        ("forward", "aten::mm", "fp32", "matmul", 512, 64, 10000, 1, 2 * 512 * 64 * 10000,
         2.7e6, 20.5e6, 0),
        ("forward", "aten::_log_softmax", "fp32", "elementwise/norm", 0, 0, 0, 2, 0, 2e6, 2e6,
         1e6),
        ("forward", "aten::mul", "fp32", "elementwise/norm", 0, 0, 0, 4, 0, 2e6, 2e6, 1e6),
        ("optimizer", "aten::_fused_adamw_", "fp32", "optimizer", 0, 0, 0, 1, 0, 16e6, 12e6, 0),
    ], columns=["phase", "op", "dtype", "op_class", "m", "k", "n", "calls", "flops",
                "bytes_read", "bytes_written", "elements"])


def _calibration():
    from lmperf.runtime.calibration import Calibration

    dims = (16, 64, 256, 1024)
    # FLOP/s grow with the smallest dimension: 64-wide products at half the square's rate
    return Calibration(threads=1, matmul=[[m, k, n, 100e9 * (min(m, k, n) / 1024) ** 0.25]
                                          for m in dims for k in dims for n in dims],
                       bandwidth=[[2**18, 40e9], [2**26, 10e9]],
                       element_rates={"softmax": [[2**20, 1e9], [2**25, 1e9]]},
                       optimizer_bytes_per_s=28e9)


def test_cpu_ops_are_held_to_the_ceiling_of_their_own_size():
    cal = _calibration()
    rows = list(_sized_costs().itertuples())
    square, narrow, softmax, mul, adamw = (pr.cpu_op_s(r, cal, 1e9, 1e9) for r in rows)
    assert square == pytest.approx(2 * 1024**3 / 100e9)
    assert narrow == pytest.approx(rows[1].flops / 50e9)  # 64 wide: half the square's FLOP/s
    assert narrow / rows[1].flops > square / rows[0].flops
    # no FLOPs counted: exp / log per element at the measured rate, not the bytes' 0.1 ms
    assert softmax == pytest.approx(1e6 / 1e9)
    assert mul == pytest.approx(4e6 / cal.bandwidth_bytes_per_s(1e6))  # 1 MB per call
    assert adamw == pytest.approx(28e6 / 28e9)  # the optimizer at fused AdamW's bandwidth
    # a bf16 product: the grid's figure scaled by the dtype's square ceiling over fp32's
    assert pr.cpu_op_s(rows[0], cal, 0.5e9, 1e9) == pytest.approx(2 * square)


def test_cpu_rows_pay_their_faulted_bytes_at_the_calibrated_rate():
    from dataclasses import replace

    cal = replace(_calibration(), fresh_output_s_per_byte=1e-9)
    row = _sized_costs().iloc[3].copy()  # aten::mul, 4 calls: its bytes' time only
    before = pr.cpu_op_s(row, cal, 1e9, 1e9)  # a table without the column: no faults
    row["fault_bytes"] = 40 * 2**20  # the heap replay says its outputs fault in 40 MiB
    assert pr.cpu_op_s(row, cal, 1e9, 1e9) - before == pytest.approx(40 * 2**20 * 1e-9)
    row["fault_bytes"] = 0
    assert pr.cpu_op_s(row, cal, 1e9, 1e9) == pytest.approx(before)


def test_the_cpu_optimizer_phase_pays_its_measured_host_time_per_parameter_tensor():
    from dataclasses import replace

    cal = replace(_calibration(), optimizer_fixed_s=1e-3, optimizer_tensor_s=1e-4)
    cpu = pr.Target("cpu", {"fp32": 100e9}, 40e9, None, 1e-6, True, "test", cal)
    t = pr.phase_times(_sized_costs(), cpu, param_tensors=30)
    assert t["optimizer"][1] == pytest.approx(28e6 / 28e9 + 1e-3 + 30 * 1e-4)
    # the bytes a phase's frees give back to the kernel (heap replay) at the calibrated rate
    cpu = replace(cpu, calibration=replace(cal, give_back_s_per_byte=1e-10))
    given = pr.phase_times(_sized_costs(), cpu, param_tensors=30,
                           returned_bytes={"optimizer": 5e6})
    assert given["optimizer"][1] - t["optimizer"][1] == pytest.approx(5e6 * 1e-10)
    assert given["forward"][1] == pytest.approx(t["forward"][1])
    # forward keeps the target's time per op call (8 calls)
    forward = [pr.cpu_op_s(r, cal, 100e9, 100e9) for r in list(_sized_costs().itertuples())[:4]]
    assert t["forward"][1] == pytest.approx(sum(forward) + 8 * 1e-6)
    # ... unless the calibration measured one per phase
    timed = replace(cpu, calibration=replace(cal, forward_op_s=1e-5, backward_op_s=2e-5))
    assert pr.phase_times(_sized_costs(), timed, param_tensors=30)["forward"][1] == \
        pytest.approx(sum(forward) + 8 * 1e-5)


def test_cpu_target_adds_the_calls_and_its_ideal_is_the_best_ceiling():
    cpu = pr.Target("cpu", {"fp32": 100e9}, 40e9, None, 1e-6, True, "test", _calibration())
    t = pr.phase_times(_sized_costs(), cpu)
    rows = list(_sized_costs().itertuples())
    forward = [pr.cpu_op_s(r, cpu.calibration, 100e9, 100e9) for r in rows[:4]]
    assert t["forward"][1] == pytest.approx(sum(forward) + 8 * 1e-6)
    assert t["forward"][0] < t["forward"][1]
    assert t["optimizer"][1] == pytest.approx(28e6 / 28e9 + 1e-6)


def test_the_gpu_path_keeps_one_row_per_op():
    # two mm rows, one compute-bound and one memory-bound: summed first, as before sizes
    costs = _sized_costs()
    costs.loc[1, "bytes_written"] = 2e9  # the narrow product memory-bound on this GPU
    t = pr.phase_times(costs, pr.Target("gpu", {"fp32": 1e12}, 1e12, pr.FRACTIONS, 1e-9, False,
                                        "test"))
    mm = costs[costs["op"] == "aten::mm"]
    f = pr.FRACTIONS["matmul"]
    expected = max(mm["flops"].sum() / (1e12 * f.compute),
                   (mm["bytes_read"] + mm["bytes_written"]).sum() / (1e12 * f.memory))
    rest = (4e6 + 4e6) / (1e12 * pr.FRACTIONS["elementwise/norm"].memory)  # softmax, mul
    assert t["forward"][1] == pytest.approx(expected + rest)


def test_prediction_errors_pair_phases_with_the_measured_run():
    spec = {"size": "tiny", "model": None, "context": 128, "batch": 4, "precision": "fp32",
            "mode": "train-step"}
    predicted = {"kind": "prediction", "spec": spec, "metrics": {
        p: {"typical_s": s} for p, s in (("forward", 0.012), ("backward", 0.02),
                                         ("optimizer", 0.003))}}
    measured = {"kind": "bench", "status": "ok", "spec": spec, "metrics": {
        "forward_ms": {"median": 10.0}, "backward_ms": {"median": 25.0},
        "optimizer_ms": {"median": 3.0},
        "cpu_time": {"forward_ms": {"median": 8.0}, "backward_ms": {"median": 20.0},
                     "optimizer_ms": {"median": 2.0}}}}
    other = {**measured, "spec": {**spec, "context": 256}}
    df = pr.prediction_errors([predicted], [measured, other])
    assert list(df["phase"]) == ["forward", "backward", "optimizer"]
    assert list(df["error_wall"].round(6)) == [0.2, -0.2, 0.0]
    assert list(df["error_cpu"].round(6)) == [0.5, 0.0, 0.5]
    pooled = {**measured, "metrics": {**measured["metrics"], "cpu_time": {
        **measured["metrics"]["cpu_time"], "clock": "process_time"}}}  # --threads 2: summed
    df = pr.prediction_errors([predicted], [pooled])
    assert df["cpu_ms"].isna().all() and df["error_cpu"].isna().all()
    assert list(df["error_wall"].round(6)) == [0.2, -0.2, 0.0]


@pytest.mark.slow
def test_cpu_prediction_records_its_calibration(tmp_path):
    import lmperf
    from lmperf.runtime.calibration import Calibration

    report = lmperf.bench(size="tiny", context=32, precision="fp32", predict=["cpu"],
                          out=tmp_path / "b.jsonl")
    (record,) = report.records
    p = record["prediction"]
    cal = Calibration.from_dict(p["calibration"])
    assert len(cal.matmul) == 64 and p["calibration_method"] in report.findings
    assert p["flops_per_s"]["fp32"] >= max(rate for *_, rate in cal.matmul)  # the ideal's roof
    assert {"bf16", "fp16"} <= set(p["flops_per_s"])  # measured, not fp32's figure reused
    assert p["caveats"] == []  # fp32: calibrated shape by shape
    for phase in ("forward", "backward", "optimizer"):
        assert 0 < record["metrics"][phase]["ideal_s"] < record["metrics"][phase]["typical_s"]


def test_a_user_model_fake_tensors_cannot_run_is_one_line_before_any_calibration(monkeypatch):
    from lmperf.workload.spec import RunSpec

    def calibrate(threads=None):
        raise AssertionError("calibrated before counting")

    monkeypatch.setattr(pr, "cpu_target", calibrate)
    spec = RunSpec.from_size("tiny", context=8, batch=1,
                             model="tests.fixtures.models:data_dependent")  # .item()
    with pytest.raises(SpecError) as e:
        pr.predict([spec], ["cpu"])
    assert "data_dependent" in str(e.value) and "\n" not in str(e.value)


def test_a_cpu_bf16_prediction_says_its_matmuls_are_not_validated(monkeypatch):
    from lmperf.workload.spec import RunSpec

    cpu = pr.Target("cpu", {"fp32": 1e11, "bf16": 1e9}, 1e10, None, 1e-5, True, "test",
                    caveats={"bf16": "bf16 matmuls NOT VALIDATED"})
    monkeypatch.setattr(pr, "cpu_target", lambda threads=None: cpu)
    specs = [RunSpec.from_size("tiny", context=8, batch=1, mode="forward", num_layers=1,
                               precision=p) for p in ("fp32", "bf16-mixed")]
    fp32, bf16 = pr.predict(specs, ["cpu"])
    assert fp32["prediction"]["caveats"] == [] and bf16["prediction"]["caveats"] == [
        "bf16 matmuls NOT VALIDATED"]
    findings = pr.build_report([fp32, bf16]).findings
    assert "bf16 matmuls NOT VALIDATED" in findings
    assert "forward_op_s" in bf16["prediction"]["host_op_source"]  # what the CPU charges
    assert not any(f.startswith("host time per op") for f in findings)  # the GPU's assumption
    assert "bf16 matmuls NOT VALIDATED" not in pr.build_report([fp32]).findings
