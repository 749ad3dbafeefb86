"""Child-process entry point: `python -m lmperf.attnbench.child SPEC.json RESULT.json [--max-memory-gib G]`.

Measures one AttnSpec in a fresh process with bench's child protocol (`lmperf.bench.child.serve`).
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run the AttnSpec in SPEC.json and write its record to RESULT.json; exit code 0 if written."""
    from lmperf.attnbench.measure import run_spec
    from lmperf.attnbench.spec import AttnSpec
    from lmperf.bench.child import serve

    return serve(argv, "lmperf.attnbench.child", AttnSpec.from_dict, run_spec)


if __name__ == "__main__":
    sys.exit(main())
