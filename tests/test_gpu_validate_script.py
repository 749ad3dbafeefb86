"""scripts/gpu-validate.sh, checked on a CPU machine so that a lent GPU's minutes are not spent on
a renamed flag: every lmperf command in it parses with lmperf's own parser, its steps and time
limits fit the 9 minutes, it writes at most 8 files into $OUT, and without a CUDA device it stops
at once saying so."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmperf.cli import build_parser
from lmperf.core.vocabulary import check_args, renamed

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu-validate.sh"
TEXT = SCRIPT.read_text()
STEPS = ["env", "doctor", "attention", "bench", "predict", "profile", "memory", "dist"]
INTO = dict(re.findall(r"\[(\w+)\]=(\w+)", re.search(r"declare -A INTO=\((.*)\)", TEXT).group(1)))
"""A step whose records go into another step's file (attention -> bench)."""
VARS = {"GPU": "H100-SXM", "WORK": "/tmp/work", "OUT": "/tmp/out"}


def _bodies() -> dict[str, str]:
    """step name -> the body of its function, continuation lines joined."""
    found = re.findall(r"^step_(\w+)\(\) \{(.*?)^\}", TEXT, flags=re.M | re.S)
    return {name: body.replace("\\\n", " ") for name, body in found}


def _commands(body: str) -> list[list[str]]:
    """The argv of every `lm ...` command in a step's body (shell variables substituted)."""
    out = []
    for line in body.splitlines():
        for part in re.split(r"\|\||&&|;", line.split(" #")[0]):
            if part.strip().startswith("lm "):
                part = re.sub(r"\$\{?(\w+)\}?", lambda m: VARS[m.group(1)], part)
                out.append(shlex.split(part)[1:])
    return out


COMMANDS = [(step, argv) for step, body in _bodies().items() for argv in _commands(body)]


def test_the_steps_their_functions_and_limits_fit_nine_minutes():
    assert re.search(r"^STEPS=\((.*)\)$", TEXT, flags=re.M).group(1).split() == STEPS
    assert list(_bodies()) == STEPS
    limits = dict(re.findall(r"\[(\w+)\]=(\d+)",
                             re.search(r"declare -A LIMIT=\((.*?)\)", TEXT, re.S).group(1)))
    assert list(limits) == STEPS and sum(map(int, limits.values())) <= 9 * 60
    assert 'timeout -k 10 "$limit" bash -c "step_$step"' in TEXT  # each step under its own limit


@pytest.mark.parametrize("step, argv", COMMANDS, ids=[" ".join(a[:2]) for _, a in COMMANDS])
def test_every_lmperf_command_parses_with_lmperfs_own_parser(step, argv, capsys):
    if argv == ["--version"]:
        return
    command = argv[0]
    assert renamed(command, argv) is None
    try:
        args = build_parser(command).parse_args(argv)
    except SystemExit:
        pytest.fail(f"step {step}: lmperf {' '.join(argv)}: {capsys.readouterr().err.strip()}")
    check_args(args.command, args)
    assert args.device == "cuda", argv  # the script validates the GPU, never the CPU
    # its records are copied into $OUT, in its own file or the one it shares
    assert str(args.out) == f"/tmp/work/{INTO.get(step, step)}.jsonl", argv


def test_every_step_runs_lmperf_and_the_outputs_fit_the_device_tool():
    recording = {step for step, argv in COMMANDS if argv != ["--version"]}
    assert recording == set(STEPS) - {"env"}  # env prints the versions into the log
    files = {f"{INTO.get(step, step)}.jsonl" for step in recording}
    files |= {m for m in re.findall(r'"\$OUT/([^"]+)"', TEXT) if "$" not in m}
    files.add(re.search(r'LOG="\$OUT/([^"]+)"', TEXT).group(1))
    assert files == {"gpu-validate.log", "trace.json.gz",
                     *(f"{s}.jsonl" for s in STEPS[1:] if s not in INTO)}
    assert 'file=${INTO[$step]:-$step}.jsonl' in TEXT  # the loop copies the shared file
    assert len(files) <= 8 and all(len(Path(f).parts) <= 3 for f in files)


@pytest.mark.slow
def test_without_a_cuda_device_it_stops_at_once_saying_so(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": sys.executable}
    start = time.monotonic()
    got = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=60)
    assert got.returncode != 0 and time.monotonic() - start < 60
    assert "no CUDA device" in got.stderr
    assert os.listdir(tmp_path / "out") == ["gpu-validate.log"]
    bad = subprocess.run(["bash", str(SCRIPT), "benchmark"], capture_output=True, text=True,
                         env=env, timeout=60)
    assert bad.returncode == 2 and "unknown step 'benchmark'" in bad.stderr


def test_the_attention_step_is_the_flash_suite_of_issue_37():
    (argv,) = [a for step, a in COMMANDS if step == "attention"]
    args = build_parser("attention").parse_args(argv)
    assert (args.suite, args.dtype, args.steps) == ("flash", ["bf16"], 50)
    assert args.attention == ["naive", "sdpa", "flash-triton"]
    assert args.context == [1024, 4096, 16384] and args.d == [64, 128]
    assert args.timeout and args.warmup >= 1  # flash-triton's launch search: a warm-up call


def _rows_failed(path: Path, skip: int = 0) -> str:
    """The script's own `rows_failed` (its step verdict over the records), run on `path`."""
    function = re.search(r"^rows_failed\(\) \{.*?^\}", TEXT, re.S | re.M).group()
    got = subprocess.run(["bash", "-c", f'{function}\nrows_failed "$1" "$2"', "-", str(path),
                          str(skip)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PY": sys.executable})
    assert got.returncode == 0, got.stderr
    return got.stdout.strip()


def test_a_step_whose_rows_failed_fails(tmp_path):
    """The first H200 run's bench step exited 0 over 6 error rows and was reported "ok"."""
    data = Path(__file__).parent / "data" / "h200"
    assert _rows_failed(data / "first-run-bench.jsonl") == "6 of 6 rows error, oom or fail"
    assert _rows_failed(data / "first-run-bench.jsonl", skip=6) == ""  # rows of earlier steps
    assert _rows_failed(data / "memory.jsonl") == ""
    torn = tmp_path / "torn.jsonl"  # a write cut short by a kill
    torn.write_text((data / "memory.jsonl").read_text().splitlines()[0][:100] + "\n")
    assert _rows_failed(torn) == "1 of 1 rows error, oom or fail"
    assert "FAILED ROWS" in TEXT and 'bad=$(rows_failed "$WORK/$file"' in TEXT
