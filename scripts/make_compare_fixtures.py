"""How the fixture records of tests/compare were made (run once, from the repository root:
`.venv/bin/python scripts/make_compare_fixtures.py tests/compare/data`, on an empty folder).

tiny, context 32, fp32 and bf16-mixed, 2 warm-up + 10 timed steps, each run in its own child
process: the reference LM (base.jsonl), the reference again (again.jsonl) and
tests.fixtures.models:twice (twice.jsonl, twice the work in every phase), interleaved per
precision. Recorded 2026-11-23 16:25 UTC on the 2-core development VM (Intel Xeon, torch
2.13.0+cpu, one thread per run) at a 1-minute load average of 1.1: a quiet moment, as the
records' env says. They are real measurements: tests assert only what these records show.
rounds.jsonl (16:32 UTC, load 1.5) is `lmperf bench --size tiny --context 32 --precision fp32
bf16-mixed --steps 10 --warmup 2 --rounds 2 --out tests/compare/data/rounds.jsonl`.
"""
import sys
from pathlib import Path
import lmperf

out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
arms = [("base", None), ("twice", "tests.fixtures.models:twice"), ("again", None)]
for prec in ["fp32", "bf16-mixed"]:
    for name, model in arms:
        lmperf.bench(size="tiny", context=32, precision=prec, steps=10, warmup=2, model=model,
                     out=out / f"{name}.jsonl")
