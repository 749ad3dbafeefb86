"""Child-process entry point: `python -m lmperf.bench.child SPEC.json RESULT.json [--max-memory-gib G]`.

Runs one spec in a fresh process and writes its record to RESULT.json. A child that dies before
writing (a crash, a kill, the kernel's OOM killer) leaves no result: the parent then makes an
'error' record from the exit status and the child's log.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    """Run the spec in SPEC.json and write the record to RESULT.json; exit code 0 if written."""
    parser = argparse.ArgumentParser(prog="lmperf.bench.child")
    parser.add_argument("spec_path")
    parser.add_argument("result_path")
    parser.add_argument("--max-memory-gib", type=float, default=None)
    args = parser.parse_args(argv)

    import torch  # imported here so that argument errors above stay cheap

    from lmperf.bench.runner import run_spec
    from lmperf.bench.spec import RunSpec
    from lmperf.runtime.device import cap_memory

    with open(args.spec_path, encoding="utf-8") as f:
        spec = RunSpec.from_dict(json.load(f))
    cap = cap_memory(torch.device(spec.device), args.max_memory_gib) if args.max_memory_gib else None
    record = run_spec(spec)
    if cap:
        record["memory_cap"] = cap
    tmp = args.result_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f, allow_nan=False)
    import os

    os.replace(tmp, args.result_path)  # the parent never sees a half-written result
    return 0


if __name__ == "__main__":
    sys.exit(main())
