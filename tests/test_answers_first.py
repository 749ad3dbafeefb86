"""Every command answers first (issue 43): at 120 columns its first line is the answer, a
sentence with its figures (not a title), and no line is longer than 120 characters but a
command to run, kept whole. Each command runs on tiny settings on the CPU."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lmperf.cli import main
from lmperf.questions.amp import EXPERIMENT_NAMES

DATA = Path(__file__).parent / "compare" / "data"
TINY = ["--size", "tiny", "--context", "16", "--batch", "2"]
COMMANDS: dict[str, list[str]] = {
    "bench": ["bench", *TINY, "--precision", "fp32", "--warmup", "0", "--steps", "2", "--inline"],
    "bench --predict": ["bench", *TINY, "--predict", "H100", "A100-80GB"],
    "memory": ["memory", *TINY, "--mode", "train-step", "--inline"],
    "memory --estimate": ["memory", *TINY, "--estimate", "--gib", "0.001"],  # nothing fits
    "profile": ["profile", *TINY, "--warmup", "1", "--steps", "2", "--inline"],
    "train": ["train", *TINY, "--steps", "3", "--precision", "fp32", "bf16-mixed",
              "--eval-batches", "1", "--no-plots", "--inline"],
    "attention": ["attention", "--attention", "naive", "sdpa", "--context", "16", "--d", "16",
                  "--warmup", "0", "--steps", "2", "--inline"],
    "doctor": ["doctor", "--check", "peak table entry", "GradScaler disabled path"],
    "compare --by": ["compare", str(DATA / "base.jsonl"), "--by", "precision"],
    "dist train": ["dist", "train", "--world-size", "2", "--strategy", "flat", *TINY,
                   "--warmup", "1", "--steps", "2", "--no-plots"],
    "dist --estimate": ["dist", "--estimate", "--ffn-only", "--d-model", "64", "--d-ff", "256",
                        "--num-layers", "2", "--gpus", "8"],
    "plan": ["plan", "--size", "tiny", "--gpu", "H100-SXM", "--gpus", "8", "--context", "64",
             "--global-batch", "16", "--checkpoint", "none"],
    **{f"amp {name}": ["amp", name] for name in EXPERIMENT_NAMES},
}
NO_OUT = ("compare --by",)  # reads records, writes none


@pytest.mark.parametrize("name", list(COMMANDS))
def test_the_first_line_is_the_answer_and_no_line_is_cut(name, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    argv = COMMANDS[name] + ([] if name in NO_OUT else ["--out", str(tmp_path / "r.jsonl")])
    assert main(argv) == 0
    captured = capsys.readouterr()
    first = captured.out.splitlines()[0]
    # a sentence with figures, not a title ("lmperf bench on ...", "amp formats: formats")
    assert re.search(r"\d", first) and not first.startswith(("lmperf ", "amp ")), first
    for line in (captured.out + captured.err).splitlines():  # a command or a path kept whole
        assert (len(line) <= 120 or re.search(r"(lmperf \w+|torchrun) (--|\w)", line)
                or " " not in line.strip()), line
