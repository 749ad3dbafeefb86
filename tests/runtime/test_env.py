"""Environment capture: the keys a record's env carries, JSON-ready."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest
import torch

import lmperf
from lmperf.runtime import device as dev
from lmperf.runtime import env as envmod

KEYS = {"lmperf", "git_commit", "python", "torch", "cuda", "cudnn", "device", "device_name",
        "cpu_model", "torch_threads", "float32_matmul_precision", "load_average_1m", "timestamp"}


@pytest.fixture
def captured(monkeypatch):
    monkeypatch.setenv("GIT_OPTIONAL_LOCKS", "0")  # `git status` must not touch the index
    return envmod.capture(torch.device("cpu"))


def test_capture_keys(captured):
    assert KEYS <= set(captured)


def test_capture_is_json_ready(captured):
    text = json.dumps(captured, allow_nan=False)
    assert json.loads(text) == captured


def test_capture_values(captured):
    assert captured["lmperf"] == lmperf.__version__
    assert captured["torch"] == torch.__version__
    assert captured["device"] == "cpu"
    assert captured["device_name"] == dev.cpu_model() == captured["cpu_model"]
    assert captured["torch_threads"] == torch.get_num_threads()
    assert captured["float32_matmul_precision"] == torch.get_float32_matmul_precision()
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", captured["python"])
    load = captured["load_average_1m"]
    assert load is None or (isinstance(load, float) and load >= 0)


def test_capture_timestamp_is_utc_iso(captured):
    ts = dt.datetime.fromisoformat(captured["timestamp"])
    assert ts.utcoffset() == dt.timedelta(0)
    assert abs((dt.datetime.now(dt.timezone.utc) - ts).total_seconds()) < 600


def test_git_commit_format(captured):
    commit = captured["git_commit"]
    assert commit is None or re.fullmatch(r"[0-9a-f]{40}(-dirty)?", commit)
