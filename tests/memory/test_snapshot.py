"""CUDA memory snapshots: the offline summary of a fixture in torch's format, the restricted
loader, and the recording's CUDA-only paths (checked on the CPU with fakes of the device layer).

`data/snapshot_small.pickle` is synthetic (no GPU here), written by `data/make_snapshot_fixture.py`
from torch's own code for the snapshot structure; its docstring has the event table the expected
numbers below are read from. Replace it with a real snapshot from a GPU when one is available.
"""

from __future__ import annotations

import collections
import importlib.util
import os
import pickle
from pathlib import Path

import pandas as pd
import pytest
import torch

from lmperf.workload import build
from lmperf.workload.spec import RunSpec
from lmperf.errors import LmperfError, SpecError
from lmperf.questions.memory import snapshot_record as snap
from lmperf.questions.memory.snapshot_record import record_snapshot
from lmperf.questions.memory.snapshot_read import (
    NO_STACK, SnapshotFormatError, load_snapshot, summarize_snapshot, top_frames,
)
from lmperf.runtime import device as dev

DATA = Path(__file__).parent / "data"
FIXTURE = DATA / "snapshot_small.pickle"
M = 2**20
CPU = torch.device("cpu")

# Active MiB after each event, from the table in make_snapshot_fixture.py (start row first).
ACTIVE_MIB = [12, 18, 18, 42, 45, 45, 21, 29, 29, 25, 25, 25, 25, 19, 19, 16, 26, 26, 26, 26, 26]
LOSS_LIVE = range(10, 17)  # events after which the 4-byte loss L is live
RESERVED_MIB = [20, 20, 52, 52, 52, 52, 52, 52, 52, 52, 54, 54, 54, 54, 54, 54, 54, 54, 54, 52, 52]


def _fixture_script():
    spec = importlib.util.spec_from_file_location("make_snapshot_fixture", DATA / "make_snapshot_fixture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    return summarize_snapshot(FIXTURE, tmp_path_factory.mktemp("png") / "active.png")


def write_pickle(path: Path, obj: object) -> Path:
    with open(path, "wb") as f:
        pickle.dump(obj, f)
    return path


# --- the fixture ----------------------------------------------------------------------------------------

def test_fixture_is_what_its_script_writes(tmp_path):
    assert _fixture_script().write(tmp_path / "s.pickle").read_bytes() == FIXTURE.read_bytes()


def test_torch_own_viewer_reads_the_fixture():
    # torch's private viewer module: pure Python, its text views work without a GPU
    _memory_viz = pytest.importorskip("torch.cuda._memory_viz")
    data = load_snapshot(FIXTURE)
    stats = _memory_viz.segsum(data)  # raises on a segment whose blocks do not add up
    assert "total_reserved: 52.0MiB" in stats and "total_allocated: 26.0MiB" in stats
    assert "20 entries" in _memory_viz.trace(data)


@pytest.mark.parametrize("path", sorted(DATA.glob("snapshot_*.pickle")), ids=lambda p: p.name)
def test_invariants_of_every_snapshot_fixture(path):
    check_invariants(path)


def check_invariants(path: Path) -> None:
    """What holds for any snapshot torch writes (a real one dropped into data/ is checked too)."""
    s = summarize_snapshot(path)
    t = s.timeline
    assert (t["active_bytes"] >= 0).all() and (t["reserved_bytes"] >= 0).all()
    assert (t["active_bytes"] <= t["reserved_bytes"]).all()  # tensors live inside segments
    assert t["reserved_bytes"].iloc[-1] == s.reserved_bytes
    # At the dump, the replayed active memory is what the segments hold: allocated blocks, plus
    # blocks whose free was requested but not completed (memory_viz counts those until then).
    blocks = [b for seg in load_snapshot(path)["segments"] if seg.get("device", 0) == s.device
              for b in seg["blocks"]]
    allocated = sum(b["requested_size"] for b in blocks if b["state"] == "active_allocated")
    pending = sum(b["requested_size"] for b in blocks if b["state"] == "active_pending_free")
    assert allocated <= t["active_bytes"].iloc[-1] <= allocated + pending


# --- the summary ----------------------------------------------------------------------------------------

def test_summary_numbers(summary):
    assert summary.device == 0 and summary.events == 20
    assert summary.peak_active_bytes == 45 * M and summary.peak_event == 3
    assert summary.peak_time_ms == pytest.approx(0.45)  # 3 events x 150 us after the first
    assert summary.baseline_bytes == 12 * M  # P (8) live at the dump + Q (4) freed in the trace
    assert summary.reserved_bytes == 52 * M and summary.allocated_bytes == 26 * M
    assert summary.segments == 2 and summary.ooms == 1
    row = summary.summary.iloc[0]
    assert row["peak_active_mib"] == 45.0 and row["peak_at_event"] == 3
    assert row["reserved_mib"] == 52.0 and row["events"] == 20 and row["device"] == "cuda:0"


def test_active_and_reserved_over_time(summary):
    t = summary.timeline
    assert t["event"].tolist() == list(range(-1, 20))
    expected = [mib * M + 4 * (event in LOSS_LIVE) for event, mib in zip(range(-1, 20), ACTIVE_MIB)]
    assert t["active_bytes"].tolist() == expected
    assert t["reserved_bytes"].tolist() == [mib * M for mib in RESERVED_MIB]
    # What is active at the end is what the dump's segments hold as active_allocated.
    assert t["active_bytes"].iloc[-1] == 26 * M
    assert t["time_us"].iloc[0] is pd.NA and t["time_us"].iloc[1] == 1_763_700_000_000_000


def test_largest_allocations_and_their_frames(summary):
    big = summary.largest
    assert big["size_mib"].tolist()[:7] == [24, 10, 8, 8, 6, 4, 3]
    assert big["size_mib"].iloc[7] == pytest.approx(4 / M)
    first = big.iloc[0]
    assert (first["alloc_event"], first["free_event"], first["source"]) == (2, 5, "trace")
    # torch's einsum frame, C++ frames and nn.Module call frames are skipped
    assert first["top_frames"] == ("attention.py:37 scores; attention.py:52 __call__; "
                                   "transformer.py:117 forward")
    params = big.iloc[2]  # P: allocated before recording, still live (tie with G1 broken by event)
    assert params["source"] == "before recording" and params["alloc_event"] == -1
    assert params["free_event"] is pd.NA and params["top_frames"] == NO_STACK
    grad = big.iloc[1]  # G2, allocated on the autograd thread: native frames only
    assert grad["top_frames"].startswith("Blas.cpp:460 at::native::mm_out_cuda")
    assert "CachingAllocator" not in grad["top_frames"]
    q = big.iloc[5]  # Q: only its free was recorded
    assert q["top_frames"] == "freed by: steps.py:104 train_step; snapshot.py:180 _record_steps"
    assert [t for t, _ in summary.tables][1].startswith("largest allocations")


def test_png_written(summary):
    data = summary.png.read_bytes()
    assert len(data) > 5_000 and data.startswith(b"\x89PNG\r\n\x1a\n")


def test_top_frames_skip_torch_and_native_code():
    frames = [{"name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc",
               "filename": "??", "line": 0},
              {"name": "at::native::mm", "filename": "/pytorch/aten/src/ATen/native/Blas.cpp", "line": 9},
              {"name": "linear", "filename": "/x/site-packages/torch/nn/modules/linear.py", "line": 125},
              {"name": "forward", "filename": "/repo/model.py", "line": 7},
              {"name": "step", "filename": "C:\\repo\\train.py", "line": 3}]
    assert top_frames(frames) == ["model.py:7 forward", "train.py:3 step"]
    assert top_frames(frames[:3], n=1) == ["Blas.cpp:9 at::native::mm"]
    assert top_frames([]) == []


def test_device_with_most_events_is_summarised(tmp_path):
    data = load_snapshot(FIXTURE)
    moved = [dict(s, device=1) for s in data["segments"]]
    two = dict(data, segments=moved, device_traces=[[], data["device_traces"][0]])
    s = summarize_snapshot(write_pickle(tmp_path / "two.pickle", two))
    assert s.device == 1 and s.peak_active_bytes == 45 * M and s.reserved_bytes == 52 * M


def test_snapshot_without_history(tmp_path):
    data = load_snapshot(FIXTURE)
    s = summarize_snapshot(write_pickle(tmp_path / "state.pickle", dict(data, device_traces=[[]])))
    # No trace: every active_allocated block counts from the start (P 8 + G1 8 + G2 10).
    assert s.events == 0 and s.peak_active_bytes == 26 * M and s.peak_event == -1
    assert s.peak_time_ms is None and any("no allocation history" in n for n in s.notes)


# --- bad input ------------------------------------------------------------------------------------------

def test_missing_file(tmp_path):
    with pytest.raises(SnapshotFormatError, match="snapshot file not found"):
        load_snapshot(tmp_path / "nope.pickle")
    with pytest.raises(SnapshotFormatError, match="is not a file"):
        load_snapshot(tmp_path)


def test_not_a_pickle(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text('{"traceEvents": []}')
    with pytest.raises(SnapshotFormatError, match="is not a pickle file") as info:
        summarize_snapshot(path)
    assert isinstance(info.value, LmperfError) and isinstance(info.value, ValueError)
    (tmp_path / "empty").write_bytes(b"")
    with pytest.raises(SnapshotFormatError, match="is not a pickle file"):
        load_snapshot(tmp_path / "empty")


def test_pickled_list_is_unknown_format(tmp_path):
    with pytest.raises(SnapshotFormatError, match="unknown snapshot format") as info:
        load_snapshot(write_pickle(tmp_path / "l.pickle", [{"total_size": 1, "blocks": []}]))
    assert "'segments', 'device_traces'" in str(info.value) and "a pickled list" in str(info.value)


def test_dict_without_the_keys_is_unknown_format(tmp_path):
    with pytest.raises(SnapshotFormatError, match="unknown snapshot format") as info:
        load_snapshot(write_pickle(tmp_path / "d.pickle", {"segments": [], "traces": []}))
    text = str(info.value)
    assert "missing 'device_traces'" in text and "found keys: 'segments', 'traces'" in text


@pytest.mark.parametrize("bad", [{"segments": [1], "device_traces": []},
                                 {"segments": [], "device_traces": [[{"addr": 1}]]},
                                 {"segments": [], "device_traces": {}}])
def test_malformed_parts_are_unknown_format(tmp_path, bad):
    with pytest.raises(SnapshotFormatError, match="unknown snapshot format"):
        load_snapshot(write_pickle(tmp_path / "bad.pickle", bad))


class _RunsACommand:
    """Pickles as a call to os.system: what a malicious 'snapshot' would do when loaded."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def test_code_in_a_pickle_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "pwned"
    payload = {"segments": [], "device_traces": [], "x": _RunsACommand(f"touch {marker}")}
    path = write_pickle(tmp_path / "evil.pickle", payload)
    with pytest.raises(SnapshotFormatError, match=r"refused to unpickle (posix|os|nt)\.system"):
        load_snapshot(path)
    assert not marker.exists()
    with pytest.raises(SnapshotFormatError, match="refused to unpickle collections.OrderedDict"):
        load_snapshot(write_pickle(tmp_path / "od.pickle", collections.OrderedDict(a=1)))


def test_sets_and_tuples_load(tmp_path):
    data = {"segments": [], "device_traces": [], "pool": (0, 0), "tags": {1, 2}}
    assert load_snapshot(write_pickle(tmp_path / "ok.pickle", data)) == data


# --- recording: the CUDA-only paths on the CPU ----------------------------------------------------------

def tiny_spec(**changes: object) -> RunSpec:
    # forward only: the recording tests check what happens around the steps, not the steps
    fields = dict(context=16, batch=2, vocab_size=256, warmup=2, steps=3,
                  device="cuda", mode="forward")
    return RunSpec.from_size("tiny", **{**fields, **changes})


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only expectation")
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_record_snapshot_without_cuda_raises_a_clear_error(tmp_path, device):
    with pytest.raises(SpecError, match="memory snapshots need a CUDA device; ") as info:
        record_snapshot(tiny_spec(device=device), tmp_path / "s.pickle")
    assert isinstance(info.value, LmperfError) and "CUDA only" in str(info.value)
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only expectation")
def test_device_layer_is_a_no_op_without_cuda(tmp_path):
    for device in (CPU, torch.device("cuda")):
        assert "CUDA only" in dev.memory_history_unsupported_reason(device)
        assert dev.start_memory_history(device) is False
        assert dev.stop_memory_history(device) is False
        assert dev.dump_memory_snapshot(device, tmp_path / "s.pickle") is False
        assert dev.on_oom_dump(device, tmp_path / "oom.pickle") is False
    dev.cancel_oom_dump()
    assert not list(tmp_path.iterdir()) and dev.oom_dumps() == 0


@pytest.fixture
def fake_cuda(monkeypatch):
    """Pretend torch has CUDA: the private allocator APIs become recorders."""
    calls: list[tuple[str, object]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history",
                        lambda **kw: calls.append(("record", kw)))
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot",
                        lambda filename: (calls.append(("dump", filename)),
                                          Path(filename).write_bytes(FIXTURE.read_bytes())))
    monkeypatch.setattr(torch._C, "_cuda_attach_out_of_memory_observer",
                        lambda fn: calls.append(("attach", fn)), raising=False)
    from lmperf.runtime.device import snapshot as dev_snapshot

    monkeypatch.setattr(dev_snapshot, "_oom_dump", {"path": None, "attached": False, "dumps": 0})
    return calls


def test_device_layer_calls_torch_with_the_documented_arguments(tmp_path, fake_cuda):
    cuda = torch.device("cuda")
    assert dev.memory_history_unsupported_reason(cuda) is None
    assert dev.start_memory_history(cuda, max_entries=1234)
    assert fake_cuda[-1] == ("record", {"enabled": "all", "context": "all", "stacks": "python",
                                        "max_entries": 1234})
    assert dev.stop_memory_history(cuda) and fake_cuda[-1] == ("record", {"enabled": None})
    assert dev.dump_memory_snapshot(cuda, tmp_path / "sub" / "s.pickle")
    assert load_snapshot(tmp_path / "sub" / "s.pickle")["segments"]


def test_oom_observer_is_attached_once_and_follows_the_latest_path(tmp_path, fake_cuda):
    cuda = torch.device("cuda")
    assert dev.on_oom_dump(cuda, tmp_path / "a.pickle") and dev.on_oom_dump(cuda, tmp_path / "b.pickle")
    attached = [fn for name, fn in fake_cuda if name == "attach"]
    assert len(attached) == 1
    attached[0](0, 40 * M, 60 * M, 12 * M)  # what the allocator calls before raising
    assert (tmp_path / "b.pickle").exists() and not (tmp_path / "a.pickle").exists()
    dev.cancel_oom_dump()
    attached[0](0, 40 * M, 60 * M, 12 * M)
    assert dev.oom_dumps() == 1


def _fake_recording(monkeypatch, fail_at: int | None = None) -> list[str]:
    """record_snapshot's device layer replaced by recorders; the steps run on the CPU."""
    log: list[str] = []
    monkeypatch.setattr(snap, "_device_for", lambda spec: CPU)
    monkeypatch.setattr(dev, "memory_history_unsupported_reason", lambda device: None)
    monkeypatch.setattr(dev, "on_oom_dump", lambda device, path: log.append("arm oom dump"))
    monkeypatch.setattr(dev, "cancel_oom_dump", lambda: log.append("cancel oom dump"))
    monkeypatch.setattr(dev, "start_memory_history",
                        lambda device: log.append("start history"))
    monkeypatch.setattr(dev, "stop_memory_history", lambda device: log.append("stop history"))

    def dump(device, path):
        log.append(f"dump {Path(path).name}")
        Path(path).write_bytes(FIXTURE.read_bytes())

    monkeypatch.setattr(dev, "dump_memory_snapshot", dump)
    real_prepare = build.prepare

    def prepare(spec, device, regime):
        prepared = real_prepare(spec, device, regime)
        step = prepared.step

        def logged(state, obs):
            if fail_at is not None and log.count("step") == fail_at:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 40.00 MiB")
            log.append("step")
            step(state, obs)

        prepared.step = logged
        return prepared

    monkeypatch.setattr(build, "prepare", prepare)
    return log


def test_history_covers_the_measured_steps_only(tmp_path, monkeypatch):
    log = _fake_recording(monkeypatch)
    result = record_snapshot(tiny_spec(), tmp_path / "run.pickle")
    assert log == ["arm oom dump", "step", "step", "start history", "step", "step", "step",
                   "dump run.pickle", "stop history", "cancel oom dump"]
    assert (result.status, result.steps_recorded, result.oom_path) == ("ok", 3, None)
    assert summarize_snapshot(result.path).peak_active_bytes == 45 * M


def test_out_of_memory_dumps_a_snapshot_and_reports_it(tmp_path, monkeypatch):
    log = _fake_recording(monkeypatch, fail_at=3)  # 2 warm-up steps, then 1 measured step
    result = record_snapshot(tiny_spec(), tmp_path / "run.pickle")
    assert result.status == "oom" and result.path is None and result.steps_recorded == 1
    assert result.oom_path == tmp_path / "run_oom.pickle" and result.oom_path.exists()
    assert "out of memory after 1 recorded steps: CUDA out of memory" in result.message
    # the dump comes before the history stops: stopping it drops the recorded events
    assert log[-3:] == ["dump run_oom.pickle", "stop history", "cancel oom dump"]


def test_out_of_memory_in_warmup_dumps_the_state(tmp_path, monkeypatch):
    log = _fake_recording(monkeypatch, fail_at=1)
    result = record_snapshot(tiny_spec(), tmp_path / "run.pickle")
    assert result.status == "oom" and result.steps_recorded == 0
    assert "start history" not in log and log[-2:] == ["dump run_oom.pickle", "cancel oom dump"]


def test_an_existing_snapshot_is_not_overwritten(tmp_path, monkeypatch):
    _fake_recording(monkeypatch)
    (tmp_path / "run.pickle").write_bytes(b"keep")
    with pytest.raises(SpecError, match="refusing to overwrite"):
        record_snapshot(tiny_spec(), tmp_path / "run.pickle")
    assert (tmp_path / "run.pickle").read_bytes() == b"keep"


@pytest.mark.gpu
@pytest.mark.skipif(not dev.cuda_available(), reason="torch sees no CUDA device")
def test_real_snapshot_on_cuda(tmp_path):
    result = record_snapshot(tiny_spec(mode="train-step"), tmp_path / "real.pickle")
    s = summarize_snapshot(result.path, tmp_path / "real.png")
    assert result.status == "ok" and s.events > 0 and not s.largest.empty
    assert s.peak_active_bytes >= s.baseline_bytes > 0 and s.reserved_bytes >= s.allocated_bytes
    assert s.timeline["active_bytes"].iloc[-1] <= s.allocated_bytes
    check_invariants(result.path)
