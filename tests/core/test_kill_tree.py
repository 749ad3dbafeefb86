"""A killed job takes everything it started with it, also processes in sessions of their own
(torchrun and its ranks, the doctor's capped child), which a process-group kill would miss."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from lmperf.core.launch import alive, descendants, kill_process_tree

# A job that starts a grandchild in a session of its own (as torchrun is started), writes its
# pid, and waits.
JOB = """
import subprocess, sys, time
g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
open(sys.argv[1], "w").write(str(g.pid))
time.sleep(60)
"""


def test_the_tree_dies_whatever_session_it_is_in(tmp_path):
    pid_file = tmp_path / "grandchild"
    job = subprocess.Popen([sys.executable, "-c", JOB, str(pid_file)], start_new_session=True)
    try:
        deadline = time.time() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert time.time() < deadline and job.poll() is None
            time.sleep(0.05)
        grandchild = int(pid_file.read_text())
        assert grandchild in descendants(job.pid)
        assert os.getpgid(grandchild) != os.getpgid(job.pid)  # out of reach of a group kill
        kill_process_tree(job.pid)
        job.wait(timeout=10)
        deadline = time.time() + 10
        while alive(grandchild) and time.time() < deadline:
            time.sleep(0.05)
        assert not alive(grandchild)
    finally:
        if job.poll() is None:
            job.kill()
