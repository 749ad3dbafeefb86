"""Where a job runs: in this process (`run_inline`) or in a child process (`ChildProcess`,
started cold with a fresh interpreter, or `WarmChild`, forked from a warm server).

All return the job's records as a list (a job may write several, e.g. one per context length).
The child launcher turns every way a child can fail into a record: a crash or a kill is an
'error' record with the exit status and the tail of the child's log, a child that runs past its
timeout is killed and recorded as an 'error' too, and a child that exceeds its memory cap fails
inside its own measurement, which records 'oom'.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import queue
import threading
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

from lmperf.core import heartbeat
from lmperf.catalog import PRELOAD_FOR_KIND
from lmperf.core.jobs import JobSpec, class_path, job_id, resolve, threads_of
from lmperf.results.schema import make_record, to_jsonable

LOG_TAIL_LINES = 20


def as_records(result: dict | list[dict], spec: JobSpec) -> list[dict]:
    """A runner's result as a list of JSON-ready records, each tagged with the job's id."""
    records = result if isinstance(result, list) else [result]
    jid = job_id(spec)
    return [to_jsonable({**r, "job_id": jid}) for r in records]


@contextlib.contextmanager
def cpu_threads(n: int) -> Iterator[None]:
    """Run with `n` intra-op threads (0: leave torch's setting), restored afterwards."""
    if not n:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def job_env(force: bool) -> dict[str, str]:
    """What a job's environment adds for the launcher's options: `--force` runs a job that the
    pre-flight bound says cannot fit (estimate.preflight.FORCE_ENV)."""
    return {"LMPERF_FORCE": "1"} if force else {}


def run_inline(spec: JobSpec, force: bool = False) -> list[dict]:
    """Run in this process (for debugging and notebooks: a crash takes the caller down with it)."""
    before = os.environ.get("LMPERF_FORCE")
    os.environ.update(job_env(force))
    try:
        with cpu_threads(threads_of(spec)):
            return as_records(resolve(spec.runner)(spec), spec)
    finally:
        if force and before is None:
            os.environ.pop("LMPERF_FORCE", None)


class ChildProcess:
    """One job in its own process, so that a crash or an OOM cannot take the sweep down.

    The child is `python -m lmperf.core.child JOB.json RESULT.json [--max-memory-gib G]`; it
    rebuilds the spec from its class path, caps memory, sets the thread count and runs the
    spec's runner.
    """

    def __init__(self, spec: JobSpec, timeout_s: float | None = None,
                 max_memory_gib: float | None = None, force: bool = False):
        self.spec = spec
        self.timeout_s = timeout_s
        self.max_memory_gib = max_memory_gib
        self.force = force
        self.proc: subprocess.Popen | None = None

    def _job_files(self, tmp: str) -> tuple[list[str], Path, Path]:
        """Write the job file in `tmp`; return core.child's argv, the result and log paths."""
        job_path, result_path, log_path = (Path(tmp) / n for n in
                                           ("job.json", "result.json", "child.log"))
        self.progress_path = Path(tmp) / "progress.json"  # core.heartbeat: how far it got
        job = {"spec_class": class_path(self.spec), "spec": self.spec.to_dict()}
        job_path.write_text(json.dumps(job), encoding="utf-8")
        argv = [str(job_path), str(result_path)]
        if self.max_memory_gib:
            argv += ["--max-memory-gib", str(self.max_memory_gib)]
        return argv, result_path, log_path

    def run(self) -> list[dict]:
        """Start the child, wait for it, and return its records (or one 'error' record)."""
        with tempfile.TemporaryDirectory(prefix="lmperf-") as tmp:
            argv, result_path, log_path = self._job_files(tmp)
            cmd = [sys.executable, "-m", "lmperf.core.child", *argv]
            with open(log_path, "wb") as log:
                # A new session: Ctrl-C in the terminal reaches the parent only, which then
                # decides what to do with the child (kill it, keep the finished rows).
                env = {**os.environ, heartbeat.ENV: str(self.progress_path), **job_env(self.force)}
                self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True,
                                             env=env)
                try:
                    code: int | str | None = self.proc.wait(timeout=self.timeout_s)
                except subprocess.TimeoutExpired:
                    self.kill()
                    code = "timeout"
                except BaseException:  # Ctrl-C or anything else: never leave a child behind
                    self.kill()
                    raise
            return self._records(code, result_path, log_path)

    def _records(self, code: int | str | None, result_path: Path, log_path: Path) -> list[dict]:
        """The child's records, or one 'error' record for exit `code` ("timeout": killed;
        None: the fork server died)."""
        if code == "timeout":
            return [self._failed(f"timed out after {self.timeout_s:g} s; the child was killed",
                                 log_path)]
        if result_path.exists():
            return json.loads(result_path.read_text(encoding="utf-8"))
        if code is None:
            return [self._failed("the fork server died before the child ended", log_path)]
        return [self._failed(describe_exit(code), log_path)]  # type: ignore[arg-type]

    def kill(self) -> None:
        """Kill the child, everything it started, and reap it."""
        if self.proc and self.proc.poll() is None:
            kill_process_tree(self.proc.pid)
            self.proc.wait()

    def _failed(self, why: str, log_path: Path) -> dict:
        tail = log_tail(log_path)
        last = next((ln for ln in reversed(tail) if ln.strip()), "")
        progress = heartbeat.read(self.progress_path)
        message = why + heartbeat.describe(progress) + (f"; last output: {last.strip()}"
                                                         if last else "")
        extra = {"progress": progress} if progress else {}
        return failed_record(self.spec, "error", message, log_tail=tail, **extra)


def failed_record(spec: JobSpec, status: str, message: str, **extra: object) -> dict:
    """A record made in the parent for a job that left none (crash, kill, timeout, unsupported)."""
    record = make_record(spec.kind, spec.to_dict(), status, parent_env(spec), message=message,
                         **extra)
    return {**record, "job_id": job_id(spec)}


def signal_name(signum: int) -> str:
    """'SIGSEGV' for 11 ('signal N' for a number Python has no name for)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_exit(code: int) -> str:
    """Why a child ended without a result, from its exit status."""
    if code < 0:
        hint = " (killed: possibly the kernel's OOM killer)" if -code == signal.SIGKILL else ""
        return f"the child process died with {signal_name(-code)}{hint} before writing a result"
    return f"the child process exited with code {code} before writing a result"


def log_tail(path: Path, n: int = LOG_TAIL_LINES) -> list[str]:
    """The last `n` lines of a log ([] when it cannot be read)."""
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()[-n:]
    except OSError:
        return []


def parent_env(spec: JobSpec) -> dict:
    """The environment as seen by the parent, for records of children that left none."""
    import torch

    from lmperf.runtime import env

    return env.capture(torch.device(spec.device))


class ForkServer:
    """The parent's handle on `lmperf.core.forkserver`: started on first use, one per process,
    shared by every sweep; requests and replies are JSON lines, replies routed by request id."""

    _instance: "ForkServer | None" = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        # Its own session, so that Ctrl-C in the terminal does not kill it (nor its children,
        # which the parent kills itself); it exits when its stdin closes with the parent.
        self.proc = subprocess.Popen([sys.executable, "-m", "lmperf.core.forkserver",
                                      str(os.getpid())],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, bufsize=1,
                                     start_new_session=True)
        self.ids = itertools.count()
        self.waiting: dict[int, queue.Queue] = {}
        self.write_lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    @classmethod
    def get(cls) -> "ForkServer":
        """The running server, started (or restarted, if it died) on demand."""
        with cls._lock:
            if cls._instance is None or cls._instance.proc.poll() is not None:
                cls._instance = cls()
            return cls._instance

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            reply = json.loads(line)
            box = self.waiting.get(reply["id"])
            if box is not None:
                box.put(reply)
        for box in list(self.waiting.values()):  # the server died: wake every waiter
            box.put({"exit": None})

    def submit(self, request: dict) -> tuple[queue.Queue, int]:
        """Send a request; return its reply queue and id."""
        rid = next(self.ids)
        box: queue.Queue = queue.Queue()
        self.waiting[rid] = box
        with self.write_lock:
            self.proc.stdin.write(json.dumps({**request, "id": rid}) + "\n")  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
        return box, rid

    def done(self, rid: int) -> None:
        """Forget a finished request."""
        self.waiting.pop(rid, None)


class WarmChild(ChildProcess):
    """A child forked from the warm server (`lmperf.core.forkserver`), which has imported torch
    and lmperf but never initialised CUDA: the isolation of `ChildProcess` (own process and
    session, memory cap, timeout, crash -> error row with the log tail) at the cost of a fork
    instead of a fresh interpreter importing torch (~1.4 s)."""

    pid: int | None = None

    def run(self) -> list[dict]:
        """Fork the child from the server, wait for it, and return its records."""
        with tempfile.TemporaryDirectory(prefix="lmperf-") as tmp:
            argv, result_path, log_path = self._job_files(tmp)
            server = ForkServer.get()
            env = {**os.environ, heartbeat.ENV: str(self.progress_path), **job_env(self.force)}
            box, rid = server.submit({"argv": argv, "cwd": os.getcwd(), "env": env,
                                      "path": list(sys.path), "log": str(log_path),
                                      "preload": preload_of(self.spec)})
            try:
                code = self._wait(box)
            except BaseException:  # Ctrl-C or anything else: never leave a child behind
                self.kill()
                raise
            finally:
                server.done(rid)
            return self._records(code, result_path, log_path)

    def _wait(self, box: queue.Queue) -> int | str | None:
        """The child's exit code, "timeout" (it was killed), or None if the server died.
        The timeout counts from the fork: a server still importing torch does not use it up."""
        deadline = None
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                # Short waits keep Ctrl-C responsive (a blocking get would defer it).
                reply = box.get(timeout=0.2 if left is None else min(0.2, left))
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    self.kill()
                    box.get()  # the exit of the killed child
                    return "timeout"
                continue
            if "pid" not in reply:
                return reply["exit"]
            self.pid = reply["pid"]
            if self.timeout_s is not None:
                deadline = time.monotonic() + self.timeout_s

    def kill(self) -> None:
        """Kill the child (its own session) and everything it started."""
        if self.pid is not None:
            kill_process_tree(self.pid)


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (read from /proc; empty where there is none), parents before
    their children."""
    children: dict[int, list[int]] = {}
    proc = Path("/proc")
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (read from /proc)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def kill_process_tree(pid: int) -> None:
    """SIGKILL process `pid`, its process group, and every process below it with theirs.

    A job may start processes in sessions of their own (torchrun and its ranks, the doctor's
    capped child), which killing the job's group alone would leave running, re-parented to
    init. So the tree is read before anything is killed."""
    for p in [pid, *descendants(pid)]:
        for kill in (os.killpg, os.kill):  # a group where p leads one, else the process
            try:
                kill(p, signal.SIGKILL)
                break
            except (ProcessLookupError, PermissionError):
                continue


def preload_of(spec: JobSpec) -> list[str]:
    """What a job's request asks the warm server to import before forking it (once per server):
    the module of its runner and the catalog's PRELOAD_FOR_KIND for its record kind."""
    return [spec.runner.partition(":")[0], *PRELOAD_FOR_KIND.get(spec.kind, ())]


def warm_start_available() -> bool:
    """Whether children can be forked from a warm server here (POSIX: os.fork exists)."""
    return hasattr(os, "fork")
