"""Rewrite tests/train/data/golden_losses.json: `PYTHONPATH=src:. python -m tests.train.regen_golden`.

With `--print REGIME`, print that regime's curves as JSON instead (used by the cross-process
determinism test).
"""

from __future__ import annotations

import argparse
import json

from tests.train.golden import GOLDEN_PATH, compute_curves, write_golden


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--print", dest="regime", metavar="REGIME",
                        help="print one regime's curves instead of writing the file")
    args = parser.parse_args()
    if args.regime:
        print(json.dumps(compute_curves((args.regime,))[args.regime]))
        return
    doc = write_golden()
    for regime, curve in doc["curves"].items():
        print(f"{regime:<20} {curve['outcome']:<16} first {curve['losses'][0]!r:<22} "
              f"last {curve['losses'][-1]!r}")
    print(f"wrote {GOLDEN_PATH}")


if __name__ == "__main__":
    main()
