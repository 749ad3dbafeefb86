"""The host's time per op (`lmperf.estimate.host`): given, measured on the GPU at hand, or the
default, and every prediction says which. The probe runs here on the CPU, the same function a
local GPU runs."""

from __future__ import annotations

import json

import pytest
import torch

from lmperf.cli import main
from lmperf.estimate import host
from lmperf.workload.spec import RunSpec


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_the_probe_measures_the_models_own_ops_under_its_regime(precision):
    spec = host.tiny(RunSpec.from_size("small", "2026", context=512, batch=4,
                                       precision=precision, attention="sdpa",
                                       optimizer="foreach", device="cpu"))
    assert (spec.d_model, spec.num_layers, spec.context, spec.batch) == (96, 2, 16, 1)
    seconds, ops = host.probe(spec, torch.device("cpu"), steps=2)
    assert 0 < seconds < 0.1 and ops > 100  # forward, backward and optimizer ops of a step
    if precision == "bf16-mixed":  # autocast's casts are ops the host issues too
        assert ops > host.probe(spec.with_(precision="fp32"), torch.device("cpu"), steps=1)[1]


def test_given_wins_a_local_gpu_is_probed_a_remote_one_takes_the_default(monkeypatch):
    spec = RunSpec.from_size("small", "2026")
    probed = []
    monkeypatch.setattr(host, "_measured", lambda s: probed.append(s) or (9e-6, 321))
    monkeypatch.setattr(host, "local_gpu", lambda name: name == "H200")
    assert host.host_cost(13, "H200", spec) == (13e-6, host.GIVEN) and not probed
    seconds, source = host.host_cost(None, "H200", spec)
    assert seconds == 9e-6 and source.startswith("measured on this host: 321 ops") and probed
    assert probed[0].device == "cuda" and probed[0].context == 16
    assert host.host_cost(None, "B200", spec) == (host.HOST_OP_S, host.HOST_OP_SOURCE)


def test_no_gpu_here_means_no_probe_and_no_cuda_call(monkeypatch):
    monkeypatch.setattr(host, "probe", lambda *a: pytest.fail("probed a remote GPU"))
    if not torch.cuda.is_available():
        assert not host.local_gpu("H200")
        assert host.host_cost(None, "H200", RunSpec.from_size("small"))[0] == host.HOST_OP_S


def test_predict_for_a_gpu_named_with_a_host_time_answers_on_a_cpu(tmp_path, capsys):
    """`bench --predict H200 --device cuda --host-us 13` on a machine without that GPU."""
    out = tmp_path / "p.jsonl"
    assert main(["bench", "--predict", "H200", "--device", "cuda", "--host-us", "13",
                 "--size", "tiny", "--context", "32", "--out", str(out)]) == 0
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    p = record["prediction"]
    assert p["host_op_s"] == pytest.approx(13e-6) and p["host_op_source"] == host.GIVEN
    assert "13 us" in capsys.readouterr().out


def test_ranks_beyond_the_cores_share_them(monkeypatch):
    """4 CPU ranks on 2 cores each get half a core: half the FLOP/s and bandwidth, twice the
    host's time per op; 2 ranks on 2 cores keep a whole one each."""
    from lmperf.estimate import target as tg
    from lmperf.estimate.time_model import Target

    one = Target("cpu (x, 1 thread(s), measured)", {"fp32": 1e11}, 2e10, None, 1e-6, "measured",
                 True, "measured now")
    monkeypatch.setattr(tg.os, "sched_getaffinity", lambda pid: {0, 1})
    assert tg.shared(one, 2) is one
    half = tg.shared(one, 4)
    assert half.flops_per_s == {"fp32": 5e10} and half.bandwidth == 1e10
    assert half.host_op_s == 2e-6 and "4 ranks on 2 cores: 0.5 of one each" in half.name
