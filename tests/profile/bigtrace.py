"""A large real trace: a real Kineto trace's steps repeated with shifted timestamps and ids.

No event is invented: copy k of every event is the original with ts moved by k periods (the
trace's span plus 1 ms), its correlation / External id / flow id moved by k times the largest
id, and `ProfilerStep#N` renumbered N + k * (steps in the trace), so the copies are further
steps of the same program. Metadata events ("M") and the "Trace" span are written once.

Used by the tests at a small size (a few copies) and for the benchmark in docs/benchmarks.md:

    python tests/profile/bigtrace.py ../shared/fixtures/kineto/v100_ddp_sgd_5steps.json.gz \\
        /tmp/big.json --gib 2
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from pathlib import Path

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_ID_ARGS = ("correlation", "External id")


def _load(path: Path) -> dict:
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    with (gzip.open(path, "rt") if gz else open(path)) as f:
        return json.load(f)


def write_repeated(src: str | Path, dst: str | Path, copies: int | None = None,
                   gib: float | None = None) -> int:
    """Write `copies` copies of `src`'s events (or as many as make `gib` GiB) to `dst` (.gz:
    gzipped), header fields first as Kineto writes them. Returns the number of copies."""
    doc = _load(Path(src))
    events = doc["traceEvents"]
    timed = [e for e in events if e.get("ph") not in ("M",) and "ts" in e and e.get("cat") != "Trace"]
    t0 = min(float(e["ts"]) for e in timed)
    t1 = max(float(e["ts"]) + float(e.get("dur", 0)) for e in timed)
    period = (t1 - t0) + 1000.0
    max_id = 1 + max([int((e.get("args") or {}).get(k, 0) or 0) for e in events for k in _ID_ARGS]
                     + [int(e.get("id", 0)) for e in events if isinstance(e.get("id"), int)])
    steps = [int(m.group(1)) for e in events if (m := _STEP.match(str(e.get("name", ""))))]
    n_steps = max(steps) - min(steps) + 1 if steps else 1
    once = [e for e in events if e.get("ph") == "M" or e.get("cat") == "Trace"]
    dst = Path(dst)
    opener = gzip.open if dst.suffix == ".gz" else open
    with opener(dst, "wt") as out:
        out.write("{")
        for key, value in doc.items():
            if key != "traceEvents":
                out.write(f"{json.dumps(key)}: {json.dumps(value)},\n")
        out.write('"traceEvents": [\n')
        out.write(",\n".join(json.dumps(e) for e in once))
        k, written = 0, 0  # characters of JSON written (the .json's size; before gzip)
        while k < copies if copies is not None else written < gib * 2**30:
            text = ",\n" + ",\n".join(json.dumps(_shifted(e, k, period, max_id, n_steps))
                                       for e in timed)
            out.write(text)
            written += len(text)
            k += 1
        out.write("\n]}\n")
    return k


def _shifted(e: dict, k: int, period: float, max_id: int, n_steps: int) -> dict:
    if k == 0:
        return e
    e = dict(e)
    e["ts"] = float(e["ts"]) + k * period
    if isinstance(e.get("id"), int):
        e["id"] = e["id"] + k * max_id
    args = e.get("args")
    if args and any(a in args for a in _ID_ARGS):
        args = dict(args)
        for a in _ID_ARGS:
            if isinstance(args.get(a), int) and args[a] >= 0:
                args[a] += k * max_id
        e["args"] = args
    m = _STEP.match(str(e.get("name", "")))
    if m:
        e["name"] = f"ProfilerStep#{int(m.group(1)) + k * n_steps}"
    return e


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src")
    p.add_argument("dst")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--copies", type=int)
    group.add_argument("--gib", type=float, help="copies until the JSON (before any gzip) "
                                                 "holds this many GiB")
    a = p.parse_args()
    n = write_repeated(a.src, a.dst, copies=a.copies, gib=a.gib)
    print(f"{a.dst}: {n} copies, {Path(a.dst).stat().st_size / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
