"""Child-process entry point: `python -m lmperf.bench.child SPEC.json RESULT.json [--max-memory-gib G]`.

Runs one spec in a fresh process and writes its record to RESULT.json. A child that dies before
writing (a crash, a kill, the kernel's OOM killer) leaves no result: the parent then makes an
'error' record from the exit status and the child's log. `serve` is that protocol, shared by
every kind of child (bench, attention).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Callable


def serve(argv: list[str] | None, prog: str, load_spec: Callable[[dict], object],
          run: Callable[[object], dict]) -> int:
    """Parse SPEC.json RESULT.json [--max-memory-gib G], cap memory, run, write the record.

    `load_spec` turns the JSON dict into a spec (which has a `device` field); `run` measures it
    and returns a JSON-ready record. The record is written to a temporary name and renamed, so
    the parent never sees a half-written result. Returns the exit code (0 once written).
    """
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("spec_path")
    parser.add_argument("result_path")
    parser.add_argument("--max-memory-gib", type=float, default=None)
    args = parser.parse_args(argv)

    import torch  # imported here so that argument errors above stay cheap

    from lmperf.results.schema import to_jsonable
    from lmperf.runtime.device import cap_memory

    with open(args.spec_path, encoding="utf-8") as f:
        spec = load_spec(json.load(f))
    cap = cap_memory(torch.device(spec.device), args.max_memory_gib) if args.max_memory_gib else None
    record = run(spec)
    if cap:
        record["memory_cap"] = cap
    tmp = args.result_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(to_jsonable(record), f, allow_nan=False)
    os.replace(tmp, args.result_path)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the RunSpec in SPEC.json with the bench runner and write its record to RESULT.json."""
    from lmperf.bench.runner import run_spec
    from lmperf.bench.spec import RunSpec

    return serve(argv, "lmperf.bench.child", RunSpec.from_dict, run_spec)


if __name__ == "__main__":
    sys.exit(main())
