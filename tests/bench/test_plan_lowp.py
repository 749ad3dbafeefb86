"""On a CPU without native bf16 (simulated), the default bench and train leave bf16 out with a
note; asked for by name, bf16 runs with a warning."""

from __future__ import annotations

import json
import re

from lmperf.cli import main
from lmperf.questions.bench.plan import plan_bench
from tests.fixtures.lowp import AVX2_ONLY, SAPPHIRE_RAPIDS, simulate_cpu

NOTE = ("note: bf16-mixed left out of the CPU defaults: this CPU has no native bf16 (no "
        "avx512_bf16/amx_bf16 flag); bf16 matmuls run 9.0x slower than fp32 here")


def test_default_bench_plan_on_an_avx2_cpu(monkeypatch, tmp_path):
    simulate_cpu(monkeypatch, tmp_path, AVX2_ONLY, ratio=9.0)
    plan = plan_bench(device="cpu")
    assert {s.precision for s in plan.specs} == {"fp32"}
    assert [s.size for s in plan.specs] == ["tiny", "mini"]
    assert len(plan.notes) == 1 and plan.notes[0].startswith(NOTE[len("note: "):])
    asked = plan_bench(device="cpu", precision=["fp32", "bf16-mixed"])
    assert [s.precision for s in asked.specs] == ["fp32", "bf16-mixed"] * 2 and not asked.notes
    assert any(w.startswith("bf16-mixed on this CPU: no native bf16") for w in asked.warnings)


def test_default_bench_plan_on_a_native_cpu(monkeypatch, tmp_path):
    simulate_cpu(monkeypatch, tmp_path, SAPPHIRE_RAPIDS)
    plan = plan_bench(device="cpu")
    assert [s.precision for s in plan.specs] == ["fp32", "bf16-mixed"] * 2
    assert not plan.notes and not plan.warnings


def test_bench_cli_prints_the_note_within_120_columns(monkeypatch, tmp_path, capsys):
    simulate_cpu(monkeypatch, tmp_path, AVX2_ONLY, ratio=9.0)
    out = tmp_path / "r.jsonl"
    assert main(["bench", "--size", "tiny", "--context", "16", "--batch", "2", "--warmup", "1",
                 "--steps", "2", "--mode", "forward", "--inline", "--out", str(out)]) == 0
    lines = capsys.readouterr().err.splitlines()
    (i,) = [i for i, x in enumerate(lines) if "left out of the CPU defaults" in x]
    note = lines[i:i + 1] + [x for x in lines[i + 1:i + 3] if re.match(r"  \S", x)]
    assert all(len(x) <= 120 for x in note)  # wrapped as every line on stderr, the flag whole
    line = " ".join(x.strip() for x in note)
    assert line.startswith(NOTE) and line.endswith("ask for it with --precision bf16-mixed")
    assert any(x.endswith("--precision bf16-mixed") for x in note)
    assert [json.loads(x)["spec"]["precision"] for x in out.read_text().splitlines()] == ["fp32"]


def test_default_train_plan_on_an_avx2_cpu(monkeypatch, tmp_path):
    from lmperf.questions.train.api import train
    from lmperf.questions.train.plan import plan_train
    from tests.fixtures.defaults import with_api_defaults

    simulate_cpu(monkeypatch, tmp_path, AVX2_ONLY, ratio=9.0)
    plan = with_api_defaults(plan_train, train, device="cpu")
    assert [s.precision for s in plan.specs] == ["fp32"]
    assert plan.notes[0].startswith("bf16-mixed bf16-true left out of the CPU defaults: this CPU "
                                    "has no native bf16")
    assert "training 1 regime(s)" in plan.notes[1]
