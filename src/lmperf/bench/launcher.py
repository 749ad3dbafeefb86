"""Launchers: run a spec inline (in this process) or isolated (in a child process).

The isolated launcher turns every way a child can fail into a record: a crash or a kill is an
'error' record with the exit status and the tail of the child's log, a child that runs past its
timeout is killed and recorded as an 'error' too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from lmperf.bench.spec import RunSpec
from lmperf.results.schema import make_record

LOG_TAIL_LINES = 20


def run_inline(spec: RunSpec) -> dict:
    """Run in this process (for debugging: a crash takes the sweep down with it)."""
    from lmperf.bench.runner import run_spec

    return run_spec(spec)


class ChildProcess:
    """One spec in its own process, so that a crash or an OOM cannot take the sweep down.

    Subclasses for other kinds of runs set `child_module` (run as `python -m MODULE SPEC RESULT
    [--max-memory-gib G]`) and `kind` (the record kind of the error rows made here).
    """

    child_module = "lmperf.bench.child"
    kind = "bench"

    def __init__(self, spec: RunSpec, timeout_s: float | None = None,
                 max_memory_gib: float | None = None):
        self.spec = spec
        self.timeout_s = timeout_s
        self.max_memory_gib = max_memory_gib
        self.proc: subprocess.Popen | None = None

    def run(self) -> dict:
        """Start the child, wait for it, and return its record (or an 'error' record)."""
        with tempfile.TemporaryDirectory(prefix="lmperf-") as tmp:
            spec_path, result_path, log_path = (Path(tmp) / n for n in
                                                ("spec.json", "result.json", "child.log"))
            spec_path.write_text(json.dumps(self.spec.to_dict()), encoding="utf-8")
            cmd = [sys.executable, "-m", self.child_module, str(spec_path), str(result_path)]
            if self.max_memory_gib:
                cmd += ["--max-memory-gib", str(self.max_memory_gib)]
            with open(log_path, "wb") as log:
                # A new session: Ctrl-C in the terminal reaches the parent only, which then
                # decides what to do with the child (kill it, keep the finished rows).
                self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True)
                try:
                    code = self.proc.wait(timeout=self.timeout_s)
                except subprocess.TimeoutExpired:
                    self.kill()
                    return self._failed(f"timed out after {self.timeout_s:g} s; the child was killed",
                                        log_path)
                except BaseException:  # Ctrl-C or anything else: never leave a child behind
                    self.kill()
                    raise
            if result_path.exists():
                return json.loads(result_path.read_text(encoding="utf-8"))
            return self._failed(describe_exit(code), log_path)

    def kill(self) -> None:
        """Kill the child's whole process group and reap it."""
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def _failed(self, why: str, log_path: Path) -> dict:
        tail = _tail(log_path)
        last = next((ln for ln in reversed(tail) if ln.strip()), "")
        message = why + (f"; last output: {last.strip()}" if last else "")
        return make_record(self.kind, self.spec.to_dict(), "error", parent_env(self.spec),
                           message=message, log_tail=tail)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (killed: possibly the kernel's OOM killer)" if -code == signal.SIGKILL else ""
        return f"the child process died with {name}{hint} before writing a result"
    return f"the child process exited with code {code} before writing a result"


def _tail(path: Path) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    return lines[-LOG_TAIL_LINES:]


def parent_env(spec) -> dict:
    """The environment as seen by the parent, for records of children that left none."""
    import torch

    from lmperf.runtime import env

    return env.capture(torch.device(spec.device))
