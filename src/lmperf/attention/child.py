"""Child-process entry point: `python -m lmperf.attention.child SPEC.json RESULT.json [--max-memory-gib G]`.

Measures one AttnSpec in a fresh process with bench's child protocol (`lmperf.bench.child.serve`).
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run the AttnSpec in SPEC.json and write its record to RESULT.json; exit code 0 if written."""
    from lmperf.attention.measure import run_spec
    from lmperf.attention.spec import AttnSpec
    from lmperf.bench.child import serve

    return serve(argv, "lmperf.attention.child", AttnSpec.from_dict, run_spec)


if __name__ == "__main__":
    sys.exit(main())
