"""Everything the warm fork server does before its first fork leaves CUDA untouched, so a job
forked from it can use the GPU.

On the first GPU run (an H200, docs/gpu-validation.md) every forked job died at its first CUDA
call: the server's warm-up ran a backward on the meta device, and the autograd engine's first
backward asks the CUDA runtime for its device count, which initialises the driver in the server
(pytorch/pytorch#32707). Two checks, both on the server's real path (`serve()`, with `os.fork`
replaced by a probe that reports and exits):
- with any torch (CI's CPU build too): no autograd call and no torch.cuda query runs before the
  first fork (spies; what the engine does in C++ cannot be spied on, so autograd is refused
  outright);
- with a CUDA build of torch (LMPERF_CUDA_PYTHON names its interpreter; skipped without one):
  the dynamic loader looks `libcuda.so.1` up no more often than `import torch` alone does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Runs `serve()` as `python -m lmperf.core.forkserver` does, fed one request per job runner of
# the catalog (each request preloads its runner's module); the first os.fork prints what the
# spies saw (a JSON list) and exits instead of forking.
PREFORK = r"""
import json, os, re, sys
from pathlib import Path
SPY = sys.argv[1] == "spy"
calls = []
if SPY:
    import torch, torch.autograd
    def spy_on(owner, name, label, result=None, call_through=False):
        original = getattr(owner, name, None)
        if original is None:
            return
        def spy(*args, **kwargs):
            calls.append(label)
            return original(*args, **kwargs) if call_through else result
        setattr(owner, name, spy)
    for name in ("is_available", "device_count", "init", "_lazy_init", "current_device",
                 "get_device_name", "get_device_properties", "get_device_capability",
                 "set_device", "synchronize", "mem_get_info", "is_bf16_supported"):
        spy_on(torch.cuda, name, "torch.cuda." + name, 0 if name == "device_count" else False)
    for name in ("_cuda_getDeviceCount", "_cuda_init"):
        spy_on(torch._C, name, "torch._C." + name, 0)
    for name in ("backward", "grad"):
        spy_on(torch.autograd, name, "torch.autograd." + name, call_through=True)

def report_and_exit():
    sys.stdout.write(json.dumps(calls) + "\n")
    sys.stdout.flush()
    os._exit(0)

os.fork = report_and_exit
import lmperf
from lmperf.core import forkserver
src = Path(lmperf.__file__).parent
runners = sorted({m for p in src.rglob("*.py") for m in re.findall(
    r'runner: ClassVar\[str\] = "(lmperf[\w.]+):\w+"', p.read_text())})
requests = "".join(json.dumps({"id": i, "argv": [], "cwd": ".", "env": {}, "path": [],
                               "log": os.devnull, "preload": [m]}) + "\n"
                   for i, m in enumerate(runners))
sys.stdin = __import__("io").StringIO(requests)
forkserver.serve(parent=os.getppid())
"""


def _run(python: str, arg: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-c", PREFORK, arg], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env=env)


@pytest.mark.slow
def test_the_server_runs_no_autograd_and_no_cuda_query_before_its_first_fork():
    out = _run(sys.executable, "spy")
    assert out.returncode == 0, out.stderr[-1000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def _libcuda_lookups(stderr: str) -> int:
    """How many times the dynamic loader searched for libcuda.so.1 (LD_DEBUG=libs)."""
    return sum("find library=libcuda.so.1" in line for line in stderr.splitlines())


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("LMPERF_CUDA_PYTHON"),
                    reason="needs a CUDA build of torch: LMPERF_CUDA_PYTHON=/path/to/python")
def test_with_a_cuda_torch_the_server_loads_libcuda_no_more_than_import_torch():
    python = os.environ["LMPERF_CUDA_PYTHON"]
    env = {**os.environ, "LD_DEBUG": "libs", "PYTHONPATH": str(ROOT / "src")}
    version = subprocess.run([python, "-c", "import torch; print(torch.version.cuda)"],
                             capture_output=True, text=True, timeout=300, env=env)
    assert version.stdout.strip() not in ("", "None"), "LMPERF_CUDA_PYTHON's torch is no CUDA build"
    baseline = _libcuda_lookups(version.stderr)
    server = _run(python, "plain", env)
    assert server.returncode == 0, server.stderr[-1000:]
    assert baseline > 0  # the probe sees the lookups at all
    assert _libcuda_lookups(server.stderr) == baseline
