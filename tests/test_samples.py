"""The README's and the docs' sample outputs cannot go stale: each is what its command prints,
rebuilt from the records of a real run (scripts/gen_samples.py, as docs/options.md is from the
parser), and the README's `lmperf bench` sample has the columns of a fresh run and its rows on
a CPU of the sample's kind (native bf16)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from lmperf.cli import main
from tests.fixtures.lowp import SAPPHIRE_RAPIDS, simulate_cpu

REPO = Path(__file__).resolve().parents[1]


def _generator():
    path = REPO / "scripts" / "gen_samples.py"
    spec = importlib.util.spec_from_file_location("gen_samples", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _columns(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def _readme_table() -> tuple[list[str], list[str]]:
    """(header, rows) of the bench table in the README's sample."""
    sample = REPO.joinpath("README.md").read_text().split("<!-- sample: bench")[1]
    lines = sample.split("```text\n")[1].split("```")[0].splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("size "))
    rows = []
    for line in lines[i + 1:]:
        if line.split()[0] not in ("tiny", "mini"):
            break
        rows.append(line)
    return _columns(lines[i]), rows


def test_every_sample_is_what_its_command_prints_from_its_records():
    gen = _generator()
    assert gen.main(["--check"]) == 0, ("a sample is stale: run `.venv/bin/python "
                                        "scripts/gen_samples.py` and commit the result")
    readme = REPO.joinpath("README.md").read_text()
    assert "<!-- sample: bench" in readme and "$ lmperf bench\n" in readme


def test_readme_bench_sample_has_the_columns_of_a_fresh_run(tmp_path, capsys):
    assert main(["bench", "--size", "tiny", "--context", "16", "--batch", "2", "--warmup", "0",
                 "--steps", "2", "--precision", "fp32", "--inline",
                 "--out", str(tmp_path / "b.jsonl")]) == 0
    fresh = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("size "))
    header, _ = _readme_table()
    assert _columns(fresh) == header  # one size and fp32 only: the same columns still


def test_readme_bench_sample_has_the_rows_of_a_cpu_with_native_bf16(monkeypatch, tmp_path):
    from lmperf.questions.bench.plan import plan_bench

    simulate_cpu(monkeypatch, tmp_path, SAPPHIRE_RAPIDS)
    _, rows = _readme_table()
    assert len(rows) == len(plan_bench(device="cpu").specs) == 4
