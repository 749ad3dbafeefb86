"""The many-node path on one machine: two torchrun agents ("nodes") meeting at a c10d
rendezvous on localhost, each starting one rank of `python -m lmperf dist comm`; rank 0 appends
the same records `lmperf dist` writes."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from lmperf.results.store import read_records


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_agents_with_a_c10d_rendezvous(tmp_path: Path) -> None:
    out = tmp_path / "dist.jsonl"
    endpoint = f"127.0.0.1:{_free_port()}"
    args = ["-m", "lmperf", "dist", "comm", "--collective", "all_reduce", "broadcast", "--sizes",
            "4KiB", "--iters", "2", "--warmup", "1", "--out", str(out), "--timeout", "60"]
    # what a user runs on each node (dist.md): lmperf's own launcher is single-node only
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--rdzv-backend=c10d",
           f"--rdzv-endpoint={endpoint}", "--rdzv-id=lmperf-test", "--nproc-per-node=1",
           "--max-restarts=0", "--monitor-interval=0.1", *args]
    agents = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True) for _ in range(2)]
    try:
        logs = [a.communicate(timeout=180)[0] for a in agents]
    finally:
        for a in agents:
            a.kill()
    assert [a.returncode for a in agents] == [0, 0], logs
    records = read_records(out)
    assert [r["spec"]["collective"] for r in records] == ["all_reduce", "broadcast"]
    for r in records:
        assert r["status"] == "ok" and r["kind"] == "dist"
        assert r["env"]["nnodes"] == 2 and r["env"]["world_size"] == 2
        assert r["env"]["launched_by"] == "torchrun"
        assert len(r["metrics"]["per_rank_ms"]) == 2
    assert any("busbw" in log for log in logs)  # rank 0 printed the tables
