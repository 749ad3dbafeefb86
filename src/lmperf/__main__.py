"""`python -m lmperf`: the same entry point as the `lmperf` console script."""

from lmperf.cli import main

raise SystemExit(main())
