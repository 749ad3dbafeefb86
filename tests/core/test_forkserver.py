"""The warm fork server's own life: it ends with the command that started it even while it is
still importing (it does not read stdin then), it ends without the interpreter's teardown when
its stdin closes, and what a request asks it to preload is lmperf's own and touches no GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from lmperf.catalog import PRELOAD, PRELOAD_FOR_KIND

ROOT = Path(__file__).resolve().parents[2]


def _gone(pid: int) -> bool:
    """Ended: no such process, or a zombie nobody has reaped yet."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def _module(tmp_path: Path, name: str, body: str) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_server_still_warming_up_ends_with_the_process_that_started_it(tmp_path):
    """The command starts the server before it plans; if the command then ends (bad input) or
    is killed, the server must not go on importing alone: here its preload takes 60 s and the
    process that started it exits at once."""
    _module(tmp_path, "slow_preload", "import time\ntime.sleep(60)\n")
    server = (f"import sys; sys.path.insert(0, {str(tmp_path)!r}); "
              "from lmperf.core.forkserver import serve; "
              "serve(preload=('slow_preload',), parent=int(sys.argv[1]))")
    starter = textwrap.dedent(f"""
        import os, subprocess, sys
        proc = subprocess.Popen([sys.executable, "-c", {server!r}, str(os.getpid())],
                                stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        print(proc.pid, flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", starter], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 20  # the watchdog polls every 0.1 s; 20 s for a loaded CI
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = not _gone(pid)
    if alive:
        os.kill(pid, 9)
    assert not alive, "the fork server outlived the process that started it"


def test_the_server_ends_at_the_end_of_stdin_without_teardown(tmp_path):
    """At the end of stdin (the command ended) the server exits at once: atexit handlers (the
    start of the interpreter's teardown, 0.5-1.5 s with torch loaded) do not run."""
    marker = tmp_path / "teardown-ran"
    _module(tmp_path, "atexit_marker", f"""
        import atexit
        atexit.register(lambda: open({str(marker)!r}, "w").close())
    """)
    server = (f"import sys; sys.path.insert(0, {str(tmp_path)!r}); "
              "from lmperf.core.forkserver import serve; "
              "serve(preload=('atexit_marker',), warm=None)")
    proc = subprocess.run([sys.executable, "-c", server], input="", capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-500:]
    assert not marker.exists()


def test_a_request_preloads_lmperf_modules_and_the_catalogs_nothing_else():
    """Modules a request names are imported in the server once (lmperf's own, and the
    catalog's PRELOAD_FOR_KIND); a user's or a test's module is left to the child."""
    probe = textwrap.dedent("""
        import sys
        from lmperf.core.forkserver import _preload
        names = ["lmperf.model.presets", "tests.core.test_sweep", "colorsys"]
        before = [m for m in names if m in sys.modules]
        _preload(names)
        print(before, [m for m in names if m in sys.modules])
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.stdout.strip() == "[] ['lmperf.model.presets']", out.stderr[-500:]


def test_a_bench_job_asks_for_its_runner_and_an_amp_job_for_pandas_too():
    from lmperf.core.launch import preload_of
    from lmperf.questions.amp.spec import AmpSpec
    from lmperf.workload.spec import RunSpec

    assert preload_of(RunSpec.from_size("tiny")) == ["lmperf.questions.bench.job"]
    amp = preload_of(AmpSpec(experiment="formats"))
    assert amp[0] == "lmperf.questions.amp.job" and "pandas" in amp
    assert "pandas" not in PRELOAD  # bench's jobs never use it: not on every command's path


CUDA_PROBE = """
import json, re, sys
from pathlib import Path
import torch

calls = []
for name in ("is_available", "device_count", "init", "_lazy_init", "current_device",
             "get_device_name", "get_device_properties", "get_device_capability", "set_device",
             "synchronize", "mem_get_info", "memory_allocated"):
    def spy(*args, _name=name, **kwargs):
        calls.append(_name)
        return 0 if _name == "device_count" else False
    setattr(torch.cuda, name, spy)

import lmperf
from lmperf.catalog import PRELOAD, PRELOAD_FOR_KIND
src = Path(lmperf.__file__).parent
runners = set()
for path in src.rglob("*.py"):
    runners |= set(re.findall(r'runner: ClassVar\\[str\\] = "(lmperf[\\w.]+):\\w+"',
                              path.read_text()))
import importlib
for name in (*PRELOAD, *sorted(runners), *(m for ms in PRELOAD_FOR_KIND.values() for m in ms)):
    importlib.import_module(name)
print(json.dumps({"runners": sorted(runners), "calls": calls}))
"""


@pytest.mark.slow
def test_what_the_server_preloads_touches_no_gpu_at_import():
    """The server forks jobs, so nothing it imports may initialise CUDA (a forked child could
    not use it): importing every job runner's module and the catalog's preloads calls no
    torch.cuda function. Checked with spies, so it holds on a machine without a GPU too."""
    out = subprocess.run([sys.executable, "-c", CUDA_PROBE], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(result["runners"]) >= 6 and "lmperf.questions.bench.job" in result["runners"]
    assert result["calls"] == []
