"""`lmperf memory` through a local parser (lmperf.cli registers it later): runs, records, errors."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from lmperf.errors import SpecError
from lmperf.memory.cli import add_parser

QUICK = ["--size", "tiny", "--batch", "2"]


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="lmperf")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["memory", *argv])


def run(argv: list[str], tmp_path: Path, capsys) -> tuple[str, list[dict]]:
    out = tmp_path / "memory.jsonl"
    args = parse([*argv, "--out", str(out)])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    records = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return text, records


def test_default_run_prints_phases_and_saved_tensors(tmp_path, capsys):
    png = tmp_path / "memory.png"
    text, records = run([*QUICK, "--context", "16", "32", "--plot", str(png)], tmp_path, capsys)
    assert "peak memory per step (peak RSS MiB (CPU process))" in text
    assert "saved for backward per group: fp32, context 32" in text
    assert "largest saved activations" in text and "x the residual stream" in text
    assert png.stat().st_size > 0
    assert {r["kind"] for r in records} == {"memory"}
    analyses = [r["spec"]["analysis"] for r in records]
    assert analyses.count("phases") == 4 and analyses.count("saved") == 2
    phases = next(r for r in records if r["spec"]["analysis"] == "phases"
                  and r["spec"]["mode"] == "train-step")
    assert phases["status"] == "ok" and phases["metrics"]["memory"]["kind"] == "cpu_process_peak_rss"
    assert set(phases["metrics"]["memory"]["phases"]) == {"forward", "backward", "optimizer"}
    saved = next(r for r in records if r["spec"]["analysis"] == "saved")
    assert saved["metrics"]["saved"]["activation_bytes"] == saved["metrics"]["estimate_bytes"]


def test_estimate_allocates_nothing_and_answers_fits(tmp_path, capsys, monkeypatch):
    import lmperf.bench.runner as runner

    monkeypatch.setattr(runner, "prepare", lambda *a, **k: pytest.fail("--estimate built a model"))
    text, records = run(["--size", "xl", "--context", "512", "1024", "--gib", "80"], tmp_path, capsys)
    assert "context 512, fp32: 61.95 GiB estimated -> fits in 80 GiB: yes" in text
    assert "context 1024, fp32: 123.06 GiB estimated -> fits in 80 GiB: no" in text
    assert [r["metrics"]["fits"] for r in records] == [True, False]
    latex, _ = run(["--size", "tiny", "--estimate", "--format", "latex"], tmp_path, capsys)
    assert "\\begin{tabular}" in latex and "AdamW state" in latex
    # an estimate for a GPU needs no GPU
    cuda, records = run(["--size", "small", "--context", "1024", "--precision", "bf16-mixed",
                         "--device", "cuda", "--estimate"], tmp_path, capsys)
    assert "estimate (cuda): train-step, bf16-mixed" in cuda


def test_checkpoint_sweep_prints_the_tradeoff(tmp_path, capsys):
    text, records = run([*QUICK, "--context", "16", "--checkpoint", "1", "2", "--steps", "1", "--warmup", "0",
                         "--format", "markdown"], tmp_path, capsys)
    assert "#### activation checkpointing: fp32, context 16" in text
    assert [r["spec"]["checkpoint_group"] for r in records] == [0, 1, 2]
    assert all(r["metrics"]["saved_bytes"] == r["metrics"]["expected_saved_bytes"] for r in records)


def test_snapshot_is_delegated(tmp_path, capsys, monkeypatch):
    import lmperf.memory.snapshot as snapshot

    calls = []

    def fake(path, out_png=None):
        calls.append((Path(path), out_png))
        return SimpleNamespace(tables=[("memory snapshot: x", pd.DataFrame({"peak_active_mib": [1.5]}))],
                               notes=["a note"], png=None)

    monkeypatch.setattr(snapshot, "summarize_snapshot", fake)
    text, records = run(["--snapshot", str(tmp_path / "s.pickle"), "--plot", str(tmp_path / "s.png")],
                        tmp_path, capsys)
    assert calls == [(tmp_path / "s.pickle", tmp_path / "s.png")]
    assert "memory snapshot: x" in text and "a note" in text and records == []


@pytest.mark.parametrize("argv, fragment", [
    (["--context", "64", "--model-context", "32"], "context 64 is longer than the model allows"),
    (["--size", "huge"], "unknown size 'huge'"),
    (["--precision", "fp32", "fp9"], "unknown precision 'fp9'"),
    (["--attention", "flash"], "unknown attention 'flash'"),
    (["--mode", "inference"], "unknown mode 'inference'"),
    (["--batch", "0"], "batch_size must be a positive integer, got 0"),
    (["--context", "0"], "--context must be positive, got 0"),
    (["--gib", "0"], "--gib must be positive, got 0"),
    (["--top", "0"], "--top must be positive"),
    (["--steps", "0"], "--steps must be positive"),
    (["--warmup", "-1"], "--warmup must be non-negative"),
    (["--checkpoint", "3"], "--checkpoint 3 is larger than the model's 2 blocks"),
    (["--checkpoint", "-1"], "must be non-negative integers"),
    (["--model", "tests.fixtures.models:bigram", "--estimate"], "reference LM only"),
    (["--model", "tests.fixtures.models:bigram_short_context", "--context", "64"],
     "longer than the model allows"),
])
def test_bad_input_is_a_spec_error(argv, fragment, tmp_path):
    args = parse([*QUICK, *argv, "--out", str(tmp_path / "m.jsonl")])
    with pytest.raises(SpecError) as err:
        args.func(args)
    assert fragment in str(err.value)
    assert not (tmp_path / "m.jsonl").exists()  # nothing ran, nothing written
