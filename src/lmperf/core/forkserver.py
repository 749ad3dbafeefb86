"""A warm fork server: a process that has imported torch (and lmperf) once, and forks a child
per job, so that isolating a job costs a fork (milliseconds) instead of a fresh interpreter
importing torch (~1.4 s). Not multiprocessing's "forkserver", whose children re-import the
parent's `__main__` (docs/architecture.md): this one only runs `lmperf.core.child` in each fork.

Protocol, one JSON object per line. The parent writes requests on the server's stdin:
    {"id": N, "argv": [...], "cwd": DIR, "env": {...}, "path": [...], "log": FILE,
     "preload": [MODULE, ...]}
("preload": lmperf modules the job's child will import, imported here once before forking it)
and reads on its stdout {"id": N, "pid": P} once the child is forked, then
{"id": N, "exit": CODE} when it ends (CODE < 0: killed by signal -CODE). Nothing may initialise
CUDA before forking: importing torch does not, and the server runs no torch code.

`python -m lmperf.core.forkserver [PARENT_PID]`: the server ends when its stdin closes, and,
while it warms up (seconds of imports, stdin unread), as soon as PARENT_PID is no longer its
parent; at either end it exits at once, without the interpreter's teardown (~0.6 s with torch
loaded), so it never outlives the command that started it.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import traceback

from lmperf.catalog import PRELOAD, PRELOAD_FOR_KIND, WARM_UP
from lmperf.core.jobs import resolve


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent (the server) ends. The server ends when the
    command that started it does (its stdin closes), even if that command was killed outright,
    so no job outlives the command. A no-op elsewhere."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _child(request: dict) -> None:
    """In the fork: become what a fresh child process would be, run the job, exit."""
    code = 1
    try:
        os.setsid()  # its own session: Ctrl-C reaches the parent only; a kill takes the group
        _die_with_parent()
        fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.chdir(request["cwd"])  # the parent's state now, not when the server started
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[:0] = [p for p in request["path"] if p not in sys.path]
        from lmperf.core.child import main

        code = main(request["argv"])
    except SystemExit as exc:  # argparse and friends
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # a job's runner never raises for a failed run; this is a crash
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # never return into the server's loop, never run its cleanup


def warm_up(target: str = WARM_UP) -> None:
    """Run the catalog's warm-up (`lmperf.catalog.WARM_UP`: torch's lazy imports triggered once,
    here, instead of in every child). It touches no data, no thread pool, no device and no
    autograd (whose first backward initialises CUDA), so forking afterwards stays safe
    (tests/core/test_forkserver_prefork.py)."""
    try:
        resolve(target)()
    except Exception:  # a warm-up that fails costs each child its lazy imports, nothing more
        pass


def _preload(names: list[str]) -> None:
    """Import what a request names, once per server: lmperf's own modules and the catalog's
    (they run no torch code at import, so forking stays safe; tests/core/test_forkserver.py),
    nothing else (a user's or a test's module stays the child's to import)."""
    allowed = {m for ms in PRELOAD_FOR_KIND.values() for m in ms}
    for name in names:
        if name in sys.modules or not (name.startswith("lmperf.") or name in allowed):
            continue
        try:
            importlib.import_module(name)
        except Exception:  # the child imports it again, and its error row says why
            pass


def _exit_with(parent: int, ready: threading.Event, period_s: float = 0.1) -> None:
    """Until `ready` is set, check every `period_s` seconds that `parent` is still this
    process's parent, and exit at once when it is not (the command ended, or was killed, while
    the server was still importing; this process was re-parented)."""
    while not ready.wait(period_s):
        if os.getppid() != parent:
            os._exit(0)


def serve(preload: tuple[str, ...] = PRELOAD, parent: int | None = None,
          warm: str | None = WARM_UP) -> None:
    """Import `preload`, run `warm` ("module:function", None: nothing), then fork a child per
    request line until stdin closes; then exit the process. `parent`: the pid whose end ends
    the warm-up too (default: this process's parent now; the launcher passes its own pid, as
    it may have ended before this line runs)."""
    # The command starts the server before it plans (imports run side by side on two cores),
    # so a command that fails fast or is killed must not leave it importing on its own.
    ready = threading.Event()
    threading.Thread(target=_exit_with, args=(os.getppid() if parent is None else parent, ready),
                     daemon=True).start()
    for name in preload:
        try:
            importlib.import_module(name)
        except Exception:  # a module that cannot load here is loaded (and fails) in the child
            pass
    if warm:
        warm_up(warm)
    ready.set()  # from here on the end of stdin says the command ended
    out_lock = threading.Lock()

    def reply(obj: dict) -> None:
        with out_lock:
            sys.stdout.write(json.dumps(obj) + "\n")
            sys.stdout.flush()

    def reap(rid: int, pid: int) -> None:
        _, status = os.waitpid(pid, 0)
        reply({"id": rid, "exit": os.waitstatus_to_exitcode(status)})

    for line in sys.stdin:
        request = json.loads(line)
        _preload(request.get("preload", []))
        # Reap threads write replies to sys.stdout; forking while one holds the stream's
        # internal lock would hand the child a lock no thread of its own will release (its
        # final flush would then hang until its timeout). Every write goes through out_lock.
        with out_lock:
            pid = os.fork()
        if pid == 0:
            _child(request)
        reply({"id": request["id"], "pid": pid})
        threading.Thread(target=reap, args=(request["id"], pid), daemon=True).start()
    # stdin closed: the command is ending. Its children are done (or die with this process:
    # PR_SET_PDEATHSIG), and nothing here needs cleaning up.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    serve(parent=int(sys.argv[1]) if len(sys.argv) > 1 else None)
