"""Child-process entry point: `python -m lmperf.attnbench.child SPEC.json RESULT.json [--max-memory-gib G]`.

Measures one AttnSpec in a fresh process and writes its record to RESULT.json (written to a
temporary name, then renamed), exactly as `lmperf.bench.child` does for a RunSpec. A child that
dies before writing leaves no result and the parent makes the 'error' record.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv: list[str] | None = None) -> int:
    """Run the spec in SPEC.json and write the record to RESULT.json; exit code 0 if written."""
    parser = argparse.ArgumentParser(prog="lmperf.attnbench.child")
    parser.add_argument("spec_path")
    parser.add_argument("result_path")
    parser.add_argument("--max-memory-gib", type=float, default=None)
    args = parser.parse_args(argv)

    import torch

    from lmperf.attnbench.measure import run_spec
    from lmperf.attnbench.spec import AttnSpec
    from lmperf.results.schema import to_jsonable
    from lmperf.runtime.device import cap_memory

    with open(args.spec_path, encoding="utf-8") as f:
        spec = AttnSpec.from_dict(json.load(f))
    cap = cap_memory(torch.device(spec.device), args.max_memory_gib) if args.max_memory_gib else None
    record = run_spec(spec)
    if cap:
        record["memory_cap"] = cap
    tmp = args.result_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(to_jsonable(record), f, allow_nan=False)
    os.replace(tmp, args.result_path)  # the parent never sees a half-written result
    return 0


if __name__ == "__main__":
    sys.exit(main())
