"""Per-phase peak memory across contexts: rows, labels, failures."""

from __future__ import annotations

import torch

from lmperf.questions.memory.phases import MEMORY_LABELS, baseline_mib, measure_phases, phase_frame, two_numbers
from lmperf.runtime import device as dev
from lmperf.workload.probe import PhaseProbe, release_freed_memory
from lmperf.workload.spec import RunSpec
from tests.memory.handcount import C, F, H, L, V


def spec(**kw) -> RunSpec:
    return RunSpec(size="custom", d_model=C, num_layers=L, num_heads=H, d_ff=F, vocab_size=V,
                   context=32, batch=2, optimizer="foreach", **kw)


def test_rows_per_precision_context_and_mode():
    rows = [r for p in ("fp32", "tf32")
            for r in measure_phases(spec(precision=p), [32, 16], ("forward", "train-step"))]
    assert [(r.precision, r.context, r.mode) for r in rows] == [
        (p, t, m) for p in ("fp32", "tf32") for t in (16, 32) for m in ("forward", "train-step")]
    ok = [r for r in rows if r.precision == "fp32"]
    assert all(r.status == "ok" and r.memory_kind == "cpu_process_peak_rss" for r in ok)
    assert all(r.params for r in ok)
    train = next(r for r in ok if r.mode == "train-step")
    assert set(train.peaks) == set(train.held) == {"forward", "backward", "optimizer"}
    assert train.peak() >= train.start["rss"] > 0
    # tf32 is a CUDA mode: an 'unsupported' row per cell, not an exception
    assert {r.status for r in rows if r.precision == "tf32"} == {"unsupported"}

    table = two_numbers(rows)
    assert list(table["context"]) == [16, 32]
    assert table.attrs["label"] == MEMORY_LABELS["cpu_process_peak_rss"] == "peak RSS MiB (CPU process)"
    assert table["tf32 forward"].isna().all()  # numeric: the reason is in the findings
    long = phase_frame(rows)
    assert len(long) == 2 * 2 * (1 + 3)
    assert {"peak rss MiB", "held after rss MiB", "start rss MiB"} <= set(long.columns)


def test_probe_reads_start_and_held_memory():
    probe = PhaseProbe(dev.PeakMemory(torch.device("cpu")))
    probe.start()
    x = torch.ones(8 * 2**20 // 4)  # 8 MiB held across the lap
    probe.lap("forward")
    assert probe.held["forward"]["rss"] >= probe.start_mib["rss"]
    assert probe.phases["forward"]["rss"] >= probe.held["forward"]["rss"]
    del x
    release_freed_memory()
    assert baseline_mib(torch.device("cpu")) > 0
