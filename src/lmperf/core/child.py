"""Child-process entry point: `python -m lmperf.core.child JOB.json RESULT.json [--max-memory-gib G]`.

JOB.json is {"spec_class": "package.module:Class", "spec": {...}}. The child rebuilds the spec,
caps its memory, sets its CPU threads, runs the spec's runner and writes the list of records to
RESULT.json (renamed into place: the parent never reads half a result; a child that dies before
leaves none, and the parent makes the 'error' record).
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv: list[str] | None = None) -> int:
    """Run one job and write its records; returns the exit code (0 once written)."""
    parser = argparse.ArgumentParser(prog="lmperf.core.child")
    parser.add_argument("job_path")
    parser.add_argument("result_path")
    parser.add_argument("--max-memory-gib", type=float, default=None)
    args = parser.parse_args(argv)

    import torch  # imported here so that argument errors above stay cheap

    from lmperf.core.jobs import resolve, threads_of
    from lmperf.core.launch import as_records, cpu_threads
    from lmperf.runtime.device import cap_memory

    with open(args.job_path, encoding="utf-8") as f:
        job = json.load(f)
    spec = resolve(job["spec_class"]).from_dict(job["spec"])
    cap = (cap_memory(torch.device(spec.device), args.max_memory_gib)
           if args.max_memory_gib else None)
    with cpu_threads(threads_of(spec)):
        records = as_records(resolve(spec.runner)(spec), spec)
    if cap:
        records = [{**r, "memory_cap": cap} for r in records]
    tmp = args.result_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(records, f, allow_nan=False)
    os.replace(tmp, args.result_path)
    return 0


if __name__ == "__main__":
    # The parent waits for this process to end: skip the interpreter's teardown (0.5-1.5 s with
    # torch loaded), as a forked child does. The result file is closed; flush what was printed.
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
