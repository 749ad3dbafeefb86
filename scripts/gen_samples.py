"""Write the sample outputs of README.md and docs/commands/*.md from real runs, as
scripts/gen_options.py writes docs/options.md from the parser.

    .venv/bin/python scripts/gen_samples.py --run     # run each sample's command (about a minute),
                                                      # keep its records in docs/samples/, write
    .venv/bin/python scripts/gen_samples.py           # re-render every sample from those records
    .venv/bin/python scripts/gen_samples.py --check   # exit 1 if a sample is stale

A sample is the block between `<!-- sample: NAME ... -->` and `<!-- /sample -->` in a Markdown
file: the command line and what it prints on stdout (its Report as text: the same whether
printed by the run or rebuilt from its records by `lmperf table`, which `--run` checks).
`tests/test_samples.py` runs the check, so a sample cannot fall behind what the command prints:
change a renderer, then run this script (no --run needed) and commit the result.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "docs" / "samples"
# name -> (the command's arguments, the files that show it)
SAMPLES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "bench": (("bench",), ("README.md", "docs/commands/bench.md")),
    "memory": (("memory",), ("docs/commands/memory.md",)),
    "memory-estimate": (("memory", "--estimate"), ("docs/commands/memory.md",)),
    "attention": (("attention",), ("docs/commands/attention.md",)),
    "doctor": (("doctor",), ("docs/commands/doctor.md",)),
}
BLOCK = re.compile(r"(<!-- sample: (?P<name>[\w-]+)[^>]*-->\n)(?P<body>.*?)(<!-- /sample -->)",
                   re.S)


def stdout_of(name: str) -> str:
    """What `lmperf ARGS` printed on stdout, rebuilt from the sample's records."""
    from lmperf.core.kinds import build_reports
    from lmperf.results.store import read_records

    records = read_records(RECORDS / f"{name}.jsonl")
    return "".join(report.render("text") for report in build_reports(records))


def block(name: str) -> str:
    """The Markdown of one sample: the command, its stdout, where and when it ran."""
    from lmperf.results.store import read_records

    args, _ = SAMPLES[name]
    env = read_records(RECORDS / f"{name}.jsonl")[-1].get("env") or {}
    return (f"```text\n$ lmperf {' '.join(args)}\n{stdout_of(name)}```\n"
            f"*Written by `scripts/gen_samples.py` from the records in `docs/samples/{name}.jsonl`"
            f" ({env.get('device_name')}, {env.get('cpu_count')} CPUs, torch {env.get('torch')}, "
            f"load average {env.get('load_average_1m') or 0:.1f}, "
            f"{str(env.get('timestamp'))[:10]}); "
            "the progress and closing lines on stderr are left out.*\n")


def rewrite(text: str) -> str:
    """`text` with every sample block it holds written afresh."""
    return BLOCK.sub(lambda m: m.group(1) + block(m.group("name")) + m.group(4), text)


def run(name: str) -> None:
    """Run the sample's command for real (COLUMNS=120, in a scratch folder), keep its records,
    and check that they render to what it printed."""
    args, _ = SAMPLES[name]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "records.jsonl"
        done = subprocess.run([sys.executable, "-m", "lmperf", *args, "--out", str(out)],
                              cwd=tmp, capture_output=True, text=True,
                              env={**os.environ, "COLUMNS": "120"})
        if done.returncode not in (0, 1):  # the doctor exits 1 when a check failed
            sys.exit(f"lmperf {' '.join(args)} failed:\n{done.stderr}")
        RECORDS.mkdir(exist_ok=True)
        (RECORDS / f"{name}.jsonl").write_text(out.read_text())
    if stdout_of(name) != done.stdout:
        sys.exit(f"lmperf {' '.join(args)}: its records do not render to what it printed")


def main(argv: list[str]) -> int:
    for name in SAMPLES if "--run" in argv else ():
        print(f"running lmperf {' '.join(SAMPLES[name][0])} ...", file=sys.stderr)
        run(name)
    stale = []
    for path in sorted({f for _, files in SAMPLES.values() for f in files}):
        text = (ROOT / path).read_text()
        fresh = rewrite(text)
        if fresh != text:
            stale.append(path)
            if "--check" not in argv:
                (ROOT / path).write_text(fresh)
    if "--check" in argv and stale:
        print(f"stale samples in {', '.join(stale)}: run `.venv/bin/python scripts/gen_samples.py`",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
