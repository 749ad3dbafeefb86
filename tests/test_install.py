"""lmperf installs like a library (issue 26, D1): pyproject.toml declares ranges, constraints.txt
the exact versions CI installs, and a machine that already holds the dependencies (a GPU machine
with its own CUDA torch) installs lmperf with no download and no change to them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
DEPS = [Requirement(r) for r in PROJECT["dependencies"]]
EXTRAS = [Requirement(r) for reqs in PROJECT["optional-dependencies"].values() for r in reqs]
PINS = {Requirement(line).name.lower(): Requirement(line)
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")}
# The lent GPU machine's own versions (../shared/gpu/PLAN.md): lmperf must accept them as they are.
GPU_MACHINE = {"torch": "2.11.0", "numpy": "2.5.2", "triton": "3.6.0"}


@pytest.mark.parametrize("req", DEPS + EXTRAS, ids=str)
def test_every_dependency_is_a_range_and_constraints_pin_it_inside(req):
    assert req.specifier and all(s.operator == ">=" for s in req.specifier), req
    pin = PINS[req.name.lower()]
    (exact,) = pin.specifier
    assert exact.operator == "==" and req.specifier.contains(exact.version), (req, pin)


def test_the_gpu_machines_own_versions_are_accepted():
    ranges = {r.name: r.specifier for r in DEPS + EXTRAS}
    assert str(ranges["torch"]) == ">=2.4"
    for name, version in GPU_MACHINE.items():
        assert ranges[name].contains(version), (name, version)


@pytest.mark.skipif(os.environ.get("CI") != "true", reason="CI's venv is made from constraints.txt")
def test_ci_installed_the_exact_constraints():
    for name, pin in PINS.items():
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # an extra CI does not install (nvidia-ml-py), or another platform's
        assert pin.specifier.contains(re.sub(r"\+.*", "", version)), (name, version, pin)


@pytest.mark.slow
def test_an_install_over_the_installed_dependencies_downloads_and_replaces_nothing(tmp_path):
    """pip's resolver, offline, in this venv: only lmperf itself would be installed."""
    pytest.importorskip("setuptools")  # --no-build-isolation builds with this environment's
    report = tmp_path / "report.json"
    got = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index",
                          "--no-build-isolation", "--quiet", "--report", str(report), "-e", str(ROOT)],
                         capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    installs = [i["metadata"]["name"] for i in json.loads(report.read_text())["install"]]
    assert installs == ["lmperf"]
