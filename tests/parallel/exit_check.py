"""Repeated 2-rank runs of the overlapped strategy, each ending with a normal interpreter exit.

`python -m tests.parallel.exit_check REPEATS FOLDER` imports torch once, then per repeat forks two
ranks that join a gloo group (env://, a fresh port), run `overlap` through lmperf's own rank code
(`lmperf.core.rank.setup / run_items / shutdown`: asynchronous all-reduces started from
autograd hooks), and leave through `sys.exit(0)`, i.e. through the interpreter's full
finalisation, where gloo work still referenced would abort with "terminate called without an
active exception". Prints one JSON line: per rank and repeat, the exit status and whether its
stderr holds "terminate called". Forking skips ~2 s of `import torch` per process, which is
what makes 20 repeats affordable in a test.
"""

from __future__ import annotations

import gc
import json
import os
import socket
import sys
import traceback
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, log: Path) -> None:
    """A forked rank: never returns (sys.exit runs the interpreter's finalisation)."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from lmperf.questions.parallel.spec import TrainJob
    from lmperf.core.rank import run_items, setup, shutdown

    job = TrainJob(world_size=2, strategies=("overlap",), size="tiny", d_model=32, num_layers=1,
                   num_heads=2, d_ff=64, vocab_size=64, context=8, batch=2,
                   warmup=0, steps=2, profile_steps=0, timeout_s=60.0)
    ctx = setup(job, None)
    run_items(job, job.items(), ctx, lambda record: None)
    shutdown(ctx)
    sys.exit(0)


def main(repeats: int, folder: Path) -> list[dict]:
    """Run the repeats; one result per rank per repeat."""
    import torch  # imported once, before forking
    import torch.distributed  # noqa: F401

    import lmperf.questions.parallel.train  # noqa: F401

    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])  # its first use imports torch._dynamo (~2 s)
    gc.freeze()  # the imports' objects: never scanned again, nor copied on write by the ranks

    results = []
    for repeat in range(repeats):
        port = _free_port()
        children = {}
        for rank in range(2):
            log = folder / f"repeat{repeat}_rank{rank}.log"
            pid = os.fork()
            if pid == 0:
                try:
                    _rank(rank, port, log)
                except SystemExit:
                    raise  # up through main(): the interpreter exits as any program does
                except BaseException:
                    traceback.print_exc()
                    os._exit(3)
            children[pid] = (rank, log)
        for pid, (rank, log) in children.items():
            _, status = os.waitpid(pid, 0)
            text = log.read_text(errors="replace")
            results.append({"repeat": repeat, "rank": rank,
                            "exit": os.waitstatus_to_exitcode(status),
                            "terminate_called": "terminate called" in text,
                            "tail": text.splitlines()[-3:]})
    gc.unfreeze()
    return results


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), Path(sys.argv[2]))))
