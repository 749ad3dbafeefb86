"""`lmperf dist comm` warns when a collective's IQR is large against its median, as bench, train
and attention do: the record carries the warning and the report sums them up in one finding."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from lmperf.questions.parallel import comm
from lmperf.questions.parallel.report import build_report
from lmperf.questions.parallel.spec import CommJob
from lmperf.core.rank import RankContext
from lmperf.results.schema import make_record


@pytest.fixture
def one_rank_group():
    """A gloo process group of this process alone (no torchrun), destroyed afterwards."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield RankContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"),
                      backend="gloo", nnodes=1, folder=None, stage=SimpleNamespace(now=""))
    dist.destroy_process_group()


def _item(ctx: RankContext, durations_ms: list[float], monkeypatch) -> dict:
    """run_item with the host clock replaced: iteration i takes durations_ms[i]."""
    ticks = itertools.chain.from_iterable((10.0 * i, 10.0 * i + d / 1e3)
                                          for i, d in enumerate(durations_ms))
    monkeypatch.setattr(comm.timeit, "default_timer", lambda: next(ticks))
    job = CommJob(world_size=1, collectives=("all_reduce",), sizes=(1024,), warmup=0,
                  iters=len(durations_ms))
    return comm.run_item(job, "all_reduce:1024", ctx)


def test_iqr_above_the_median_is_a_warning(one_rank_group, monkeypatch):
    out = _item(one_rank_group, [1.0, 1.0, 4.0, 4.0], monkeypatch)  # median 2.5, IQR 3
    assert out["metrics"]["time_ms"]["iqr"] > out["metrics"]["time_ms"]["median"]
    (warning,) = out["warnings"]
    assert warning.startswith("all_reduce 1024 B n=1: IQR/median time 120%: the environment had "
                              "a significant influence")
    assert out["metrics"]["comparable"]  # noise does not make busbw incomparable


def test_steady_timings_carry_no_warning(one_rank_group, monkeypatch):
    assert _item(one_rank_group, [2.0, 2.0, 2.02, 2.0], monkeypatch)["warnings"] == []


def _record(collective: str, times: list[float], warnings: list[str]) -> dict:
    from lmperf.measure.stats import summarize

    spec = {"what": "comm", "collective": collective, "world_size": 2, "dtype": "fp32",
            "backend": "gloo", "size_bytes": 1024}
    metrics = {"bytes": 1024, "time_ms": summarize(times), "spread_ms": summarize([0.1] * 4),
               "algbw_gbps": 1.0, "busbw_gbps": 1.0, "bus_factor": 1.0, "comparable": True}
    return make_record("dist", spec, "ok", {}, metrics=metrics, warnings=warnings)


def test_report_sums_the_noise_up_in_one_finding():
    records = [_record("all_reduce", [1.0, 1.0, 4.0, 4.0], ["all_reduce 1024 B n=2: IQR/median"]),
               _record("broadcast", [2.0, 2.0, 2.0, 2.0], [])]
    findings = build_report(records).findings
    noise = [f for f in findings if "IQR/median" in f]
    assert noise == ["1 of 2 collective timings have an IQR/median above 10% (worst 120%: "
                     "all_reduce n=2 at 1 KiB, IQR 3 ms of median 2.5 ms): the environment "
                     "had a significant influence (other load, frequency scaling or too few --iters)"]
    quiet = build_report([_record("broadcast", [2.0] * 4, [])]).findings
    assert not any("IQR" in f for f in quiet)
