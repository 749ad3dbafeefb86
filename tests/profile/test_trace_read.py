"""The streaming trace reader (`trace_read`): a real trace's steps repeated (`bigtrace`) reads as
that many more steps with the same numbers, in memory that does not hold the document, and the
top-level fields and formats Kineto writes are read as before."""

from __future__ import annotations

import functools
import gzip
import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lmperf.errors import TraceFormatError
from lmperf.questions.profile.from_trace import step_table
from lmperf.questions.profile.trace import load_trace
from lmperf.questions.profile import trace_read
from lmperf.questions.profile.trace_read import read_trace

from tests.profile.bigtrace import write_repeated

DATA = Path(__file__).parent / "data"
NCCL = DATA / "a100_ddp_nccl_rank0of2.json.gz"


@pytest.fixture(scope="module")
def repeated(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("big") / "nccl_x2.json.gz"
    write_repeated(NCCL, path, copies=2)
    return path


def test_repeated_steps_read_as_more_steps_with_the_same_numbers(repeated):
    one, two = load_trace(NCCL), load_trace(repeated)
    assert one.n_steps == 3 and two.n_steps == 6
    assert len(two.ops) == 2 * len(one.ops) and len(two.kernels) == 2 * len(one.kernels)
    assert two.unattributed_kernels == 2 * one.unattributed_kernels
    a, b = step_table(one), step_table(two)
    first = int(a["profiler_step"].iloc[0])
    assert list(b["profiler_step"]) == list(range(first, first + 6))
    for col in ("cpu_ms", "gpu_span_ms", "gpu_busy_ms", "gpu_activities"):
        # Copy k of step i is step i + 3k; shifted epoch timestamps keep starts to 0.25 us.
        np.testing.assert_allclose(b[col].to_numpy(float), np.tile(a[col].to_numpy(float), 2),
                                   atol=2e-3, err_msg=col)


@pytest.mark.slow  # tracemalloc slows the parse ~3x
def test_memory_follows_the_kept_events_not_the_document(tmp_path):
    """json.load of this 9.8 MB document holds ~50 MB of Python objects; the reader keeps typed
    columns of the events it uses (well under half the text), never the document."""
    pytest.importorskip("ijson")  # without it the document is read whole (a warning says so)
    path = tmp_path / "nccl.json"
    path.write_bytes(gzip.decompress(NCCL.read_bytes()))
    size = path.stat().st_size
    tracemalloc.start()
    try:
        raw = read_trace(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(raw.ops) == 14346
    assert peak < 0.5 * size, (peak, size)


def test_header_fields_and_thread_names_are_read():
    raw = read_trace(NCCL)
    assert raw.meta["distributedInfo"]["rank"] == 0 and raw.meta["distributedInfo"]["world_size"] == 2
    assert raw.meta["deviceProperties"][0]["name"].startswith("NVIDIA A100")
    assert "traceEvents" not in raw.meta
    assert any("pt_autograd" in name for name in raw.thread_names.values()) or raw.thread_names


def test_a_bare_event_array_reads_like_the_document(tmp_path):
    events = json.loads(gzip.decompress(NCCL.read_bytes()))["traceEvents"]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(events))
    a, b = load_trace(NCCL), load_trace(bare)
    assert b.n_steps == a.n_steps and len(b.kernels) == len(a.kernels)
    pd.testing.assert_frame_equal(step_table(a), step_table(b))
    assert b.device_names == []  # a bare array has no deviceProperties


@pytest.mark.parametrize("text, message", [
    ('{"schemaVersion": 1, "other": []}', "no 'traceEvents' list"),
    ('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, ',
     "cannot read trace"),
    ('{"traceEvents": [1, 2]}', "is not a torch.profiler trace"),
])
def test_bad_documents_are_one_line_errors(tmp_path, text, message):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    with pytest.raises(TraceFormatError, match=message) as info:
        read_trace(bad)
    assert "\n" not in str(info.value)


def _variant(tmp_path: Path, name: str, change) -> Path:
    """The NCCL trace with its 150 cudaLaunchKernelExC launches changed by `change(event)`
    (returning None drops the event)."""
    doc = json.loads(gzip.decompress(NCCL.read_bytes()))
    events = []
    for e in doc["traceEvents"]:
        if e.get("cat") == "cuda_runtime" and e.get("name") == "cudaLaunchKernelExC":
            e = change(e)
        if e is not None:
            events.append(e)
    doc["traceEvents"] = events
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


@functools.cache
def _original():
    return load_trace(NCCL)


def test_kernels_launched_through_culaunchkernelex_are_attributed(tmp_path):
    """Triton / torch.compile kernels go through the driver's cuLaunchKernelEx (Kineto: cat
    cuda_driver): linked by correlation like any launch, whatever its name (HTA #271)."""
    path = _variant(tmp_path, "driver.json", lambda e: {**e, "cat": "cuda_driver",
                                                           "name": "cuLaunchKernelEx"})
    a, b = _original(), load_trace(path)
    ex = b.kernels["launch_name"] == "cuLaunchKernelEx"
    assert ex.sum() == 150 and b.unattributed_kernels == 0
    assert (b.kernels["step"] == a.kernels["step"]).all()
    assert (b.kernels["phase"] == a.kernels["phase"]).all()


def test_kernels_whose_launch_the_trace_lacks_are_placed_by_external_id(tmp_path):
    """Kineto versions that recorded only cuLaunchKernel among driver calls (kineto #752) leave
    a cuLaunchKernelEx kernel with no launch: its External id names the op that launched it."""
    path = _variant(tmp_path, "dropped.json", lambda e: None)
    a, b = _original(), load_trace(path)
    via = b.kernels["launch_via"]
    assert (via == "external id").sum() == 150 and b.unattributed_kernels == 0
    assert (b.kernels["step"] == a.kernels["step"]).all()
    assert (b.kernels["phase"] == a.kernels["phase"]).all()
    assert set(b.kernels.loc[via == "external id", "launch_name"]) <= set(b.ops["name"])


def _without_ijson(tmp_path: Path, argv: list[str]) -> subprocess.CompletedProcess:
    """`python -m lmperf ARGV` where `import ijson` raises ImportError (in child processes too)."""
    fake = tmp_path / "no_ijson" / "ijson"
    fake.mkdir(parents=True, exist_ok=True)
    (fake / "__init__.py").write_text("raise ImportError('ijson made unimportable by the test')\n")
    src = Path(__file__).resolve().parents[2] / "src"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake.parent), str(src)])}
    return subprocess.run([sys.executable, "-m", "lmperf", *argv], capture_output=True, text=True,
                          env=env, timeout=300, cwd=tmp_path)


@pytest.mark.slow
def test_without_ijson_profile_and_from_trace_still_answer(tmp_path):
    got = _without_ijson(tmp_path, ["profile", "--from-trace", str(DATA / "v100_ddp_sgd_5steps.json.gz")])
    assert got.returncode == 0, got.stderr
    assert "(recorded on Tesla V100-SXM2-32GB)" in got.stdout and "top kernels: step" in got.stdout
    got = _without_ijson(tmp_path, ["profile", "--size", "tiny", "--context", "32", "--batch", "2",
                                    "--steps", "2", "--warmup", "1", "--out", "p.jsonl"])
    assert got.returncode == 0, got.stderr
    assert json.loads((tmp_path / "p.jsonl").read_text())["status"] == "ok"
    assert "top operators (self time): step" in got.stdout


def test_without_ijson_the_standard_library_reads_the_same_trace(monkeypatch, tmp_path):
    with_ijson = read_trace(NCCL)
    monkeypatch.setitem(sys.modules, "ijson", None)  # `import ijson` raises ImportError
    without = read_trace(NCCL)
    assert without.n_events == with_ijson.n_events and without.meta == with_ijson.meta
    pd.testing.assert_frame_equal(without.device, with_ijson.device)
    truncated = tmp_path / "truncated.json"
    truncated.write_text('{"traceEvents": [{"ph": "X", "ts": 1, ')
    with pytest.raises(TraceFormatError, match="cannot read trace") as info:
        read_trace(truncated)  # a one-line error without ijson too
    assert "\n" not in str(info.value)


def test_without_ijson_a_big_file_is_read_with_one_warning(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ijson", None)
    monkeypatch.setattr(trace_read, "_WARN_BYTES", 10)
    raw = read_trace(NCCL)
    err = capsys.readouterr().err
    assert len(raw.ops) == 14346 and err.count("\n") == 1 and "ijson is not installed" in err
