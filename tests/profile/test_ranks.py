"""Communication vs computation per rank (`overlap`) and `--from-trace DIR` (`ranks`), on the
real A100 NCCL traces of tests/profile/data (README there).

The whole-window numbers are checked against HTA's own output on the same files
(HolisticTraceAnalysis 0.5, `TraceAnalysis(trace_dir, include_last_profiler_step=True)`:
`get_temporal_breakdown()` and `get_comm_comp_overlap()`, run 2026-11-25, see
docs/runs/2026-11-25.md). On the rank-3 trace (whole-microsecond timestamps) they agree to the
microsecond; on the rank-0 trace HTA rounds nanosecond-resolution events down to whole
microseconds first, so only the span is compared exactly there."""

from __future__ import annotations

import functools
import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from lmperf.errors import TraceFormatError
from lmperf.questions.profile import overlap, ranks
from lmperf.questions.profile.trace import load_trace

DATA = Path(__file__).parent / "data"
NCCL = DATA / "a100_ddp_nccl_rank0of2.json.gz"  # rank 0 of 2, ncclKernel_AllReduce / Broadcast
CONTROL = DATA / "a100_8gpu_rank3_control.json.gz"  # rank 3 of 8, SendRecv / AllReduce
V100 = DATA / "v100_ddp_sgd_5steps.json.gz"  # world size 1: no NCCL kernel


@functools.cache
def trace(path: Path):
    return load_trace(path)


def test_whole_window_breakdown_matches_hta_on_the_rank3_trace():
    w = overlap.breakdown(trace(CONTROL), whole=True).iloc[0]
    # HTA: idle 76007 us, compute 281336, non-compute 107251, kernel_time 464594; overlap 46.24%.
    assert w["span_ms"] == pytest.approx(464.594, abs=1e-3)
    assert w["idle_ms"] == pytest.approx(76.007, abs=1e-3)
    assert w["compute_ms"] == pytest.approx(281.336, abs=1e-3)
    assert w["non_compute_ms"] == pytest.approx(107.251, abs=1e-3)
    assert round(100 * w["comm_hidden_share"], 2) == 46.24


def test_per_step_breakdown_adds_up():
    b = overlap.breakdown(trace(CONTROL))
    assert list(b["step"]) == list(range(6))
    np.testing.assert_allclose(b["idle_ms"] + b["busy_ms"], b["span_ms"], rtol=1e-9)
    np.testing.assert_allclose(b["exposed_comm_ms"] + b["overlap_ms"], b["comm_ms"], rtol=1e-9)
    assert (b["overlap_ms"] <= b[["comm_ms", "compute_ms"]].min(axis=1) + 1e-9).all()
    assert (b["comm_ms"] > 0).all() and (b["compute_ms"] > 0).all()
    # A single-GPU run has no communication at all.
    v = overlap.breakdown(trace(V100))
    assert (v["comm_ms"] == 0).all() and v["comm_hidden_share"].isna().all()


@pytest.mark.parametrize("name, comm", [
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", True),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", True),
    ("void ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", True),
    ("void at::native::vectorized_elementwise_kernel<4>(int)", False),
    ("Memcpy DtoD (Device -> Device)", False),
])
def test_nccl_kernels_of_every_name_generation_are_communication(name, comm):
    assert overlap.is_comm_kernel(name) is comm


def test_renamed_nccl_kernels_count_the_same(tmp_path):
    """HTA #208: NCCL >= 2.19 names its kernels ncclDevKernel_*; the same trace with its kernels
    renamed so must give the same communication time."""
    doc = json.loads(gzip.decompress(NCCL.read_bytes()))
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel" and e["name"].startswith("ncclKernel_"):
            e["name"] = "ncclDevKernel_" + e["name"][len("ncclKernel_"):]
    renamed = tmp_path / "renamed.json"
    renamed.write_text(json.dumps(doc))
    a = overlap.breakdown(trace(NCCL), whole=True).iloc[0]
    b = overlap.breakdown(load_trace(renamed), whole=True).iloc[0]
    assert a["comm_ms"] > 40 and b["comm_ms"] == pytest.approx(a["comm_ms"])


@pytest.fixture(scope="module")
def rank_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ranks")
    shutil.copy(NCCL, d / "job_a.json.gz")
    shutil.copy(CONTROL, d / "job_b.pt.trace.json.gz")
    (d / "notes.txt").write_text("not a trace")
    return d


def test_directory_of_ranks(rank_dir):
    found = ranks.read_ranks(rank_dir)
    assert [r.rank for r in found] == [0, 3]  # from distributedInfo, not the names
    table = ranks.per_rank_step(found)
    assert list(table.groupby("rank").size()) == [3, 6]
    strag = ranks.stragglers(table)
    assert list(strag["step"]) == [0, 1, 2]  # steps both ranks hold
    assert (strag["slowest_rank"] == 0).all() and (strag["straggler"] == 3).all()
    assert all(set(r.phases["phase"]) >= {"forward", "backward", "step"} for r in found)
    summary = ranks.rank_summary(found).set_index("rank")
    assert summary.loc[3, "comm_hidden_share"] == pytest.approx(0.4624, abs=1e-4)
    # where each rank waits (issue 34): rank 0's GPU idle 76% of its span, nearly all of it
    # waiting for the host's launches; rank 3's busy 84%
    assert summary["bound"].to_dict() == {0: "host-bound", 3: "device-bound"}
    assert summary.loc[0, "host_wait_share"] == pytest.approx(0.7597, abs=1e-4)
    assert (summary["host_wait_share"] <= summary["idle_share"]).all()


def test_two_files_of_one_rank_are_refused(tmp_path):
    shutil.copy(NCCL, tmp_path / "a.json.gz")
    shutil.copy(V100, tmp_path / "b.json.gz")  # rank 0 too
    with pytest.raises(TraceFormatError, match="both rank 0"):
        ranks.read_ranks(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TraceFormatError, match="no trace files"):
        ranks.read_ranks(empty)


def test_cli_directory(rank_dir, tmp_path):
    from tests.profile.test_cli import _run

    code, out, err = _run(["profile", "--from-trace", str(rank_dir), "--csv", str(tmp_path / "csv")])
    assert code == 0, err
    assert "straggler" in out and "Rank 3 computes longest" in out
    assert ("GPU idle 76% of its span, 76% waiting for the host's launches: host-bound"
            in " ".join(out.split()))  # lines wrapped to the terminal
    assert (tmp_path / "csv" / "per_rank.csv").is_file()
    code, out, err = _run(["profile", "--from-trace", str(rank_dir), "--steps", "3"])
    assert code == 2 and err.strip().count("\n") == 0 and "--steps" in err
