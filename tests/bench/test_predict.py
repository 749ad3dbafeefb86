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
